package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// testGroups stands in for the group database so that goldens do not depend on the
// machine: "java" and "builders" are groups on every test machine.
func testGroups(name string) (uint32, error) {
	switch name {
	case "java":
		return 1001, nil
	case "builders":
		return 1002, nil
	}
	return 0, fmt.Errorf("group %q not found", name)
}

type specCase struct {
	name string
	spec func(s *redirect.Spec)
}

// specCases are the captures every test of this package runs: each renders to
// testdata/<name>.nft and is applied to a real kernel.
var specCases = []specCase{
	{"default-sidecar", func(s *redirect.Spec) {}},
	{"inbound-ports-list", func(s *redirect.Spec) {
		s.InboundPorts = redirect.PortSet{Ports: []uint16{8080, 80, 9090}}
	}},
	{"no-inbound", func(s *redirect.Spec) { s.InboundPorts = redirect.PortSet{} }},
	{"exclusions", func(s *redirect.Spec) {
		s.InboundPortsExclude = []uint16{22, 15020}
		s.OutboundPortsExclude = []uint16{3306, 5432}
		s.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("169.254.169.254/32")}
		s.ExcludeInterfaces = []string{"eth1", "net1"}
	}},
	{"outbound-cidrs-and-ports", func(s *redirect.Spec) {
		s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12")}}
		s.OutboundPorts = []uint16{8443}
	}},
	{"virtual-interfaces", func(s *redirect.Spec) {
		s.RerouteVirtualInterfaces = []string{"tap0", "veth-kube"}
	}},
	{"virtual-interfaces-cidrs", func(s *redirect.Spec) {
		s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		s.RerouteVirtualInterfaces = []string{"tap0"}
	}},
	{"tproxy", func(s *redirect.Spec) {
		s.Mode = redirect.ModeTProxy
		s.ExcludeInterfaces = []string{"eth1"}
	}},
	{"tproxy-ports-ipv6", func(s *redirect.Spec) {
		s.Mode = redirect.ModeTProxy
		s.InboundPorts = redirect.PortSet{Ports: []uint16{80, 443}}
		s.IPv6 = true
	}},
	{"dns-servers", func(s *redirect.Spec) {
		s.DNS = redirect.DNS{Enabled: true, Servers: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("8.8.8.8")}}
	}},
	{"dns-capture-all", func(s *redirect.Spec) {
		s.DNS = redirect.DNS{Enabled: true, CaptureAll: true}
	}},
	{"owner-groups-include", func(s *redirect.Spec) {
		s.OwnerGroups = redirect.GroupFilter{Groups: []string{"java", "2000"}}
	}},
	{"owner-groups-exclude", func(s *redirect.Spec) {
		s.OwnerGroups = redirect.GroupFilter{Except: true, Groups: []string{"builders", "3000"}}
	}},
	{"drop-invalid", func(s *redirect.Spec) { s.DropInvalid = true }},
	{"ipv6-dual", func(s *redirect.Spec) {
		s.IPv6 = true
		s.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")}
		s.DNS = redirect.DNS{Enabled: true, Servers: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")}}
	}},
	{"ipv6-cidrs-include", func(s *redirect.Spec) {
		s.IPv6 = true
		s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}}
	}},
	{"uid-gid-lists", func(s *redirect.Spec) {
		s.ProxyUIDs = []uint32{1337, 0}
		s.ProxyGIDs = []uint32{1337, 1500}
		s.DNS = redirect.DNS{Enabled: true, CaptureAll: true}
	}},
	{"loopback-included", func(s *redirect.Spec) {
		s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
		s.HostIPv4Loopback = netip.MustParsePrefix("127.0.0.0/8")
	}},
	{"everything", func(s *redirect.Spec) {
		s.Mode = redirect.ModeTProxy
		s.IPv6 = true
		s.DropInvalid = true
		s.InboundPortsExclude = []uint16{22}
		s.OutboundPortsExclude = []uint16{3306}
		s.ExcludeInterfaces = []string{"eth9"}
		s.RerouteVirtualInterfaces = []string{"tap0"}
		s.OwnerGroups = redirect.GroupFilter{Except: true, Groups: []string{"java"}}
		s.DNS = redirect.DNS{Enabled: true, CaptureAll: true}
	}},
}

// sidecarSpec is the default sidecar: every inbound port and every outbound
// destination captured.
func sidecarSpec() redirect.Spec {
	s := redirect.DefaultSpec()
	s.InboundPorts = redirect.PortSet{All: true}
	s.OutboundCIDRs = redirect.PrefixSet{All: true}
	return s
}

func (c specCase) plan(t testing.TB) *redirect.Plan {
	t.Helper()
	s := sidecarSpec()
	c.spec(&s)
	p, err := redirect.Build(s)
	if err != nil {
		t.Fatalf("build %s: %v", c.name, err)
	}
	return p
}
