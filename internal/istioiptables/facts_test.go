package istioiptables

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/specs"
)

var addrs = specs.Addrs

func TestPodAddressDecidesIPv6AsIstioDoes(t *testing.T) {
	cases := []struct {
		name      string
		addrs     []netip.Addr
		dualStack bool
		wantAddr  string
		wantIPv6  bool
		wantOK    bool
	}{
		{"no addresses", nil, false, "", false, false},
		{"only loopback and link-local", addrs("127.0.0.1", "::1", "fe80::1", "169.254.1.1"), false, "", false, false},
		{"IPv4 pod", addrs("127.0.0.1", "10.1.2.3", "::1", "fe80::1"), false, "10.1.2.3", false, true},
		{"IPv6 pod", addrs("127.0.0.1", "::1", "fd00::5", "fe80::1"), false, "fd00::5", true, true},
		{"dual-stack pod listed IPv4 first is IPv4 without --dual-stack", addrs("10.1.2.3", "fd00::5"), false, "10.1.2.3", false, true},
		{"dual-stack pod listed IPv4 first is IPv6 with --dual-stack", addrs("10.1.2.3", "fd00::5"), true, "10.1.2.3", true, true},
		{"dual-stack pod listed IPv6 first is IPv4 without --dual-stack", addrs("fd00::5", "10.1.2.3"), false, "10.1.2.3", false, true},
		{"dual-stack pod listed IPv6 first is IPv6 with --dual-stack", addrs("fd00::5", "10.1.2.3"), true, "10.1.2.3", true, true},
		{"IPv4-only pod with --dual-stack stays IPv4", addrs("10.1.2.3", "10.1.2.4"), true, "10.1.2.3", false, true},
		{"IPv4-mapped IPv6 address counts as IPv4", addrs("::ffff:10.1.2.3"), false, "10.1.2.3", false, true},
		{"link-local multicast is skipped", addrs("ff02::1", "10.0.0.1"), false, "10.0.0.1", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, ipv6, ok := PodAddress(tc.addrs, tc.dualStack)
			var want netip.Addr
			if tc.wantAddr != "" {
				want = netip.MustParseAddr(tc.wantAddr)
			}
			if addr != want || ipv6 != tc.wantIPv6 || ok != tc.wantOK {
				t.Errorf("PodAddress = %v, %v, %v; want %v, %v, %v", addr, ipv6, ok, want, tc.wantIPv6, tc.wantOK)
			}
		})
	}
}

func TestDNSServersReadsNameserversFromResolvConf(t *testing.T) {
	cases := []struct {
		name        string
		text        string
		want        []netip.Addr
		wantSkipped []string
	}{
		{"empty", "", nil, nil},
		{"kubernetes pod", "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
			addrs("10.96.0.10"), nil},
		{"several families in order", "nameserver 10.96.0.10\nnameserver fd00::a\nnameserver 1.1.1.1\n", addrs("10.96.0.10", "fd00::a", "1.1.1.1"), nil},
		{"comments and blank lines", "# nameserver 9.9.9.9\n\n; nameserver 8.8.8.8\nnameserver 10.0.0.1 # cluster dns\n", addrs("10.0.0.1"), nil},
		{"indented and tab separated", "  nameserver\t10.0.0.2\n", addrs("10.0.0.2"), nil},
		{"zoned and malformed entries are skipped", "nameserver fe80::1%eth0\nnameserver dns.example\nnameserver 10.0.0.3\n",
			addrs("10.0.0.3"), []string{"fe80::1%eth0", "dns.example"}},
		{"nameserver without address is ignored", "nameserver\n", nil, nil},
		{"other keywords are ignored", "domain example.com\nsortlist 10.0.0.0\n", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, skipped := DNSServers(tc.text)
			if diff := cmp.Diff(tc.want, got, cmpNetip); diff != "" {
				t.Errorf("servers (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSkipped, skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProxyUIDIsTheEnvoyUsersUIDElse1337(t *testing.T) {
	users := map[string]string{"istio-proxy": "1234", "weird": "not-a-number"}
	lookup := func(name string) (string, error) {
		if uid, ok := users[name]; ok {
			return uid, nil
		}
		return "", errors.New("unknown user")
	}
	cases := []struct {
		user string
		want uint32
	}{
		{"istio-proxy", 1234},
		{"nobody-here", 1337},
		{"weird", 1337},
	}
	for _, tc := range cases {
		if got := ProxyUID(tc.user, lookup); got != tc.want {
			t.Errorf("ProxyUID(%q) = %d, want %d", tc.user, got, tc.want)
		}
	}
}

func TestIdentityHintOnlyWhenNotRunningAsTheProxy(t *testing.T) {
	spec := DefaultConfig().Capture
	spec.ProxyUIDs, spec.ProxyGIDs = []uint32{1337}, []uint32{1337}
	if h := identityHint(spec, 1337, 1337); h != "" {
		t.Errorf("proxy uid got hint %q", h)
	}
	if h := identityHint(spec, 1000, 1337); h != "" {
		t.Errorf("proxy gid got hint %q", h)
	}
	if h := identityHint(spec, 0, 0); h == "" {
		t.Errorf("root got no hint")
	}
}

func TestExitCodeMapsNotRedirectedTo126(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{&NotRedirectedError{Failures: []string{"x"}}, 126},
		{errors.Join(errors.New("ctx"), &NotRedirectedError{}), 126},
	}
	for _, tc := range cases {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
