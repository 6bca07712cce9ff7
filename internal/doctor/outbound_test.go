package doctor

import (
	"net/netip"
	"testing"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

func TestOutboundTarget(t *testing.T) {
	def := netip.MustParseAddrPort("198.51.100.1:80")
	spec := func(set func(s *redirect.Spec)) redirect.Spec {
		s := redirect.DefaultSpec()
		s.OutboundCIDRs = redirect.PrefixSet{All: true}
		set(&s)
		return s
	}
	prefixes := func(ps ...string) redirect.PrefixSet {
		var out redirect.PrefixSet
		for _, p := range ps {
			out.Prefixes = append(out.Prefixes, netip.MustParsePrefix(p))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		spec  redirect.Spec
		named bool
		want  string // "" for cannot tell
	}{
		{"everything captured: the default", spec(func(*redirect.Spec) {}), false, "198.51.100.1:80"},
		{"one included range: an address in it", spec(func(s *redirect.Spec) { s.OutboundCIDRs = prefixes("10.0.0.0/8") }), false, "10.0.0.1:80"},
		{"port 80 excluded: another port", spec(func(s *redirect.Spec) { s.OutboundPortsExclude = []uint16{80} }), false, "198.51.100.1:8080"},
		{"port 80 excluded in a range", spec(func(s *redirect.Spec) { s.OutboundCIDRs, s.OutboundPortsExclude = prefixes("10.0.0.0/8"), []uint16{80} }), false, "10.0.0.1:8080"},
		{"the range's first address excluded", spec(func(s *redirect.Spec) {
			s.OutboundCIDRs, s.OutboundCIDRsExclude = prefixes("10.0.0.0/24", "192.168.0.0/16"), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
		}), false, "192.168.0.1:80"},
		{"only included ports", spec(func(s *redirect.Spec) { s.OutboundCIDRs, s.OutboundPorts = prefixes(), []uint16{5432} }), false, "198.51.100.1:5432"},
		{"nothing captured", spec(func(s *redirect.Spec) { s.OutboundCIDRs = prefixes() }), false, ""},
		{"only IPv6 ranges for an IPv4 target", spec(func(s *redirect.Spec) { s.OutboundCIDRs = prefixes("fd00::/8") }), false, ""},
		{"a named target is kept when captured", spec(func(*redirect.Spec) {}), true, "198.51.100.1:80"},
		{"a named target not captured: cannot tell", spec(func(s *redirect.Spec) { s.OutboundCIDRs = prefixes("10.0.0.0/8") }), true, ""},
	} {
		got, reason := outboundTarget(tc.spec, def, tc.named)
		switch {
		case tc.want == "" && (got.IsValid() || reason == ""):
			t.Errorf("%s: %v (%q), want cannot tell", tc.name, got, reason)
		case tc.want != "" && (got.String() != tc.want || reason != ""):
			t.Errorf("%s: %v (%q), want %s", tc.name, got, reason, tc.want)
		}
	}
}
