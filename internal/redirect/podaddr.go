package redirect

import "net/netip"

// PodAddress picks the pod's address from the namespace's addresses, in the order
// the kernel lists them, as Istio does: loopback and link-local addresses are
// skipped, and IPv6 is captured when the first remaining address is IPv6 or, with
// dualStack, when any of them is. ok is false when no address qualifies.
func PodAddress(addrs []netip.Addr, dualStack bool) (addr netip.Addr, ipv6 bool, ok bool) {
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
			continue
		}
		if !ok {
			addr, ok = a, true
		}
		if a.Is6() {
			ipv6 = true
		}
		if !dualStack {
			break
		}
	}
	return addr, ipv6, ok
}
