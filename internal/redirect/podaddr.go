package redirect

import "net/netip"

// PodAddress picks the pod's address from the namespace's addresses as Istio does:
// loopback and link-local addresses are skipped, and since the kernel lists every
// IPv4 address before any IPv6 one, the address is the first IPv4 address, else the
// first IPv6 one, whatever the order of addrs (a previous plugin's result may list
// IPv6 first: Cilium's does). IPv6 is captured when the pod has no IPv4 address or,
// with dualStack, when it has any IPv6 address. ok is false when no address
// qualifies.
func PodAddress(addrs []netip.Addr, dualStack bool) (addr netip.Addr, ipv6 bool, ok bool) {
	var first4, first6 netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
			continue
		}
		if a.Is4() && !first4.IsValid() {
			first4 = a
		}
		if a.Is6() && !first6.IsValid() {
			first6 = a
		}
	}
	switch {
	case first4.IsValid():
		return first4, dualStack && first6.IsValid(), true
	case first6.IsValid():
		return first6, true, true
	}
	return netip.Addr{}, false, false
}
