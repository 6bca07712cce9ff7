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

// PodAddress is redirect.PodAddress: the rule is shared with the plugin.
func PodAddress(addrs []netip.Addr, dualStack bool) (addr netip.Addr, ipv6 bool, ok bool) {
	return redirect.PodAddress(addrs, dualStack)
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
