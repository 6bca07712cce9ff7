package istioiptables

import (
	"bufio"
	"net/netip"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// These pure functions derive what Istio takes from the pod's environment rather
// than from its flags. Run feeds them the live data.

// ProxyUID is the proxy uid when none was given: the uid of user (Istio's
// ENVOY_USER, istio-proxy by default) if lookup finds it, else 1337.
func ProxyUID(user string, lookup func(name string) (uid string, err error)) uint32 {
	if uid, err := lookup(user); err == nil {
		if id, err := redirect.ParseID(uid); err == nil {
			return id
		}
	}
	return redirect.DefaultProxyUID
}

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

// DNSServers returns the nameservers of a resolv.conf, in order. Entries that are
// not plain IP addresses (for example with a zone, which no rule can match) are
// returned in skipped.
func DNSServers(resolvConf string) (servers []netip.Addr, skipped []string) {
	sc := bufio.NewScanner(strings.NewReader(resolvConf))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || a.Zone() != "" {
			skipped = append(skipped, f[1])
			continue
		}
		servers = append(servers, a.Unmap())
	}
	return servers, skipped
}
