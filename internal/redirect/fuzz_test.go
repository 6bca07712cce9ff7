package redirect_test

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/trace"
)

// Pod authors write these strings (annotations), so the parsers must never panic, and
// whatever they accept must build a plan that holds every invariant.

// unsafeNameChars may not appear in an accepted interface or group name: whitespace,
// quotes, and characters a shell, iptables or nft would read as syntax.
const unsafeNameChars = " \t\n\r\v\f\"'`\\;&|$<>(){}[]*?!~#+/:,=%^"

func checkBuilds(t *testing.T, s Spec) *Plan {
	t.Helper()
	p, err := Build(s)
	if err != nil {
		t.Fatalf("accepted input does not build: %v\nspec %+v", err, s)
	}
	if err := p.Check(); err != nil {
		t.Fatalf("accepted input builds a plan that breaks an invariant: %v", err)
	}
	return p
}

func checkTraces(t *testing.T, p *Plan, pkts ...trace.Packet) {
	t.Helper()
	for _, pkt := range pkts {
		if _, err := trace.Trace(p, pkt); err != nil {
			t.Fatalf("tracer fails on a built plan: %v", err)
		}
	}
}

func FuzzParsePortSet(f *testing.F) {
	for _, s := range []string{"", "*", " * ", "80", "6000,7000,", "80, 443", "0", "65535", "65536", "*,80", "+80", "080", "80-90", ",,", "1,1,1", "\x00", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParsePortSet(s)
		if err != nil {
			if !strings.Contains(err.Error(), `"`) {
				t.Errorf("error %q does not quote the value", err)
			}
			return
		}
		if set.All && len(set.Ports) > 0 {
			t.Fatalf("%q: '*' with ports %v", s, set.Ports)
		}
		seen := map[uint16]bool{}
		for _, p := range set.Ports {
			if p == 0 || seen[p] {
				t.Fatalf("%q: port list %v has 0 or a duplicate", s, set.Ports)
			}
			seen[p] = true
		}
		// What was accepted reads back the same.
		if !set.All {
			text := make([]string, len(set.Ports))
			for i, p := range set.Ports {
				text[i] = strconv.Itoa(int(p))
			}
			again, err := ParsePortSet(strings.Join(text, ","))
			if err != nil || !slices.Equal(again.Ports, set.Ports) || again.All {
				t.Fatalf("%q: %v does not read back (%v, %v)", s, set.Ports, again, err)
			}
		}
		for _, mode := range []Mode{ModeRedirect, ModeTProxy} {
			spec := DefaultSpec()
			spec.Mode = mode
			spec.InboundPorts = set
			spec.InboundPortsExclude = set.Ports
			spec.OutboundPorts = set.Ports
			spec.OutboundPortsExclude = set.Ports
			spec.IPv6 = true
			checkBuilds(t, spec)
		}
	})
}

func FuzzParsePrefixSet(f *testing.F) {
	for _, s := range []string{"", "*", "10.0.0.0/8", "10.0.0.1/8", "1.2.3.4", "fd00::1/64", "::ffff:1.2.3.4", "::ffff:1.2.3.4/120",
		"127.1.2.3/32", "fe80::1%eth0", "10.0.0.0/33", "0.0.0.0/0", "::/0", "10.0.0.0/8,fd00::/8,", "*,10.0.0.0/8", "1.2.3.4/ 8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParsePrefixSet(s)
		if err != nil {
			if !strings.Contains(err.Error(), `"`) {
				t.Errorf("error %q does not quote the value", err)
			}
			return
		}
		if set.All && len(set.Prefixes) > 0 {
			t.Fatalf("%q: '*' with prefixes", s)
		}
		for _, p := range set.Prefixes {
			if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" {
				t.Fatalf("%q: accepted %v, which is not a canonical CIDR", s, p)
			}
			again, err := ParsePrefix(p.String())
			if err != nil || again != p {
				t.Fatalf("%q: %v does not read back (%v, %v)", s, p, again, err)
			}
		}
		spec := DefaultSpec()
		spec.OutboundCIDRs = set
		spec.OutboundCIDRsExclude = set.Prefixes
		spec.InboundPorts = PortSet{All: true}
		spec.IPv6 = true
		spec.DNS = DNS{Enabled: true}
		for _, p := range set.Prefixes {
			spec.DNS.Servers = append(spec.DNS.Servers, p.Addr())
		}
		plan := checkBuilds(t, spec)
		var pkts []trace.Packet
		for _, p := range set.Prefixes {
			if p.Addr().Is4In6() {
				continue // no IPv4-mapped packet exists on the wire
			}
			a := p.Addr()
			pkts = append(pkts, trace.Packet{Direction: trace.Outbound, Src: a, Dst: a, Proto: UDP, SrcPort: 1, DstPort: 53, OutIface: "eth0", UID: 1000})
		}
		checkTraces(t, plan, pkts...)
	})
}

func FuzzParseInterfaceList(f *testing.F) {
	for _, s := range []string{"", "eth0", "eth0,net1,", " eth1 , eth2 ", "eth0+", "a b", "abcdefghijklmnop", "abcdefghijklmno", ".", "..",
		"eth0;reboot", "$(id)", "-j", "eth0.100", "br-x_1", "veth@if3", "é", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ParseInterfaceList(s)
		if err != nil {
			if !strings.Contains(err.Error(), `"`) {
				t.Errorf("error %q does not quote the value", err)
			}
			return
		}
		for _, name := range names {
			if len(name) == 0 || len(name) > 15 || strings.ContainsAny(name, unsafeNameChars) || name[0] == '-' {
				t.Fatalf("%q: accepted interface name %q", s, name)
			}
			for _, c := range []byte(name) {
				if c < 0x21 || c > 0x7e {
					t.Fatalf("%q: accepted interface name %q with byte %#x", s, name, c)
				}
			}
		}
		spec := DefaultSpec()
		spec.ExcludeInterfaces = names
		spec.RerouteVirtualInterfaces = names
		spec.InboundPorts = PortSet{All: true}
		spec.OutboundCIDRs = PrefixSet{All: true}
		spec.Mode = ModeTProxy
		plan := checkBuilds(t, spec)
		var pkts []trace.Packet
		for _, name := range names {
			pkts = append(pkts,
				trace.Packet{Direction: trace.Inbound, Src: pod4, Dst: pod4, Proto: TCP, SrcPort: 1, DstPort: 80, InIface: name},
				trace.Packet{Direction: trace.Outbound, Src: pod4, Dst: pod4, Proto: TCP, SrcPort: 1, DstPort: 80, OutIface: name})
		}
		checkTraces(t, plan, pkts...)
	})
}

func FuzzSetOwnerGroups(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"*", ""}, {"java,202", ""}, {"", "888,ftp"}, {"java", "ftp"}, {"a b", ""}, {"", "1java"},
		{"host$", ""}, {"", "a$b"}, {"*", "*"}, {"4294967296", ""}, {strings.Repeat("g,", 65), ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, include, exclude string) {
		got, err := specs.Settings{FieldOwnerGroupsInclude: include, FieldOwnerGroupsExclude: exclude}.Spec()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "owner groups") {
				t.Errorf("error %q does not name the field", err)
			}
			return
		}
		gf := got.OwnerGroups
		if len(gf.Groups) > MaxOwnerGroups {
			t.Fatalf("accepted %d groups", len(gf.Groups))
		}
		for _, g := range gf.Groups {
			// A trailing '$' (a machine account, as useradd allows) expands to nothing.
			name := strings.TrimSuffix(g, "$")
			if name == "" || len(g) > 32 || strings.ContainsAny(name, unsafeNameChars) || g[0] == '-' {
				t.Fatalf("(%q, %q): accepted group %q", include, exclude, g)
			}
			for _, c := range []byte(g) {
				if c < 0x21 || c > 0x7e {
					t.Fatalf("(%q, %q): accepted group %q with byte %#x", include, exclude, g, c)
				}
			}
		}
		spec := DefaultSpec()
		spec.OwnerGroups = gf
		spec.OutboundCIDRs = PrefixSet{All: true}
		plan := checkBuilds(t, spec)
		var pkts []trace.Packet
		for _, g := range gf.Groups {
			pkts = append(pkts, trace.Packet{Direction: trace.Outbound, Src: pod4, Dst: netip.MustParseAddr("10.0.0.5"), Proto: TCP, SrcPort: 1, DstPort: 80, OutIface: "eth0", GroupName: g})
		}
		checkTraces(t, plan, pkts...)
	})
}

func FuzzSettingsSpec(f *testing.F) {
	type seed struct {
		inPorts, inExclude, outCIDRs, outExclude, outPorts, outPortsExclude, ifaces, reroute, groupsIn, groupsEx, uid, gid, mode, loopback, dns string
		flags                                                                                                                                   uint8
	}
	for _, s := range []seed{
		{},
		{inPorts: "*", inExclude: "15090,15021,15020", outCIDRs: "*", flags: 0xff},
		{inPorts: "*", outCIDRs: "9.9.0.0/16", outExclude: "1.1.0.0/16", mode: "TPROXY", dns: "127.0.0.53", ifaces: "not-istio-nic", flags: 0x0f},
		{inPorts: "4000,5000", inExclude: "6000,7000,", reroute: "eth0,eth1", outCIDRs: "2001:db8::/32", outExclude: "2001:db8::/32", uid: "3,4", gid: "1,2", flags: 0x10},
		{outPorts: "32000,31000", groupsIn: "java,202"},
		{groupsEx: "888,ftp", loopback: "127.0.0.1/8", outPortsExclude: "6379"},
		{groupsIn: "java", groupsEx: "ftp"},
		{inPorts: "70000", ifaces: "eth0+", mode: "tproxy", loopback: "10.0.0.0/8"},
	} {
		f.Add(s.inPorts, s.inExclude, s.outCIDRs, s.outExclude, s.outPorts, s.outPortsExclude, s.ifaces, s.reroute, s.groupsIn, s.groupsEx, s.uid, s.gid, s.mode, s.loopback, s.dns, s.flags)
	}
	f.Fuzz(func(t *testing.T, inPorts, inExclude, outCIDRs, outExclude, outPorts, outPortsExclude, ifaces, reroute, groupsIn, groupsEx, uid, gid, mode, loopback, dns string, flags uint8) {
		bit := func(b uint8) string { return strconv.FormatBool(flags&b != 0) }
		o := specs.Settings{
			FieldInboundPorts: inPorts, FieldInboundPortsExclude: inExclude,
			FieldOutboundCIDRs: outCIDRs, FieldOutboundCIDRsExclude: outExclude,
			FieldOutboundPorts: outPorts, FieldOutboundPortsExclude: outPortsExclude,
			FieldExcludeInterfaces: ifaces, FieldRerouteVirtualInterfaces: reroute,
			FieldOwnerGroupsInclude: groupsIn, FieldOwnerGroupsExclude: groupsEx,
			FieldProxyUIDs: uid, FieldProxyGIDs: gid, FieldMode: mode, FieldHostIPv4Loopback: loopback,
			FieldRedirectDNS: bit(1), FieldCaptureAllDNS: bit(2), FieldDropInvalid: bit(4), FieldIPv6: bit(8),
		}
		o[FieldDNSServers] = dns
		for f, v := range o {
			if v == "" {
				delete(o, f) // unset, as an empty flag or annotation is
			}
		}
		s, err := o.Spec()
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("Spec() returned a spec that does not validate: %v", err)
		}
		plan := checkBuilds(t, s)
		var pkts []trace.Packet
		for _, v6 := range []bool{false, true} {
			own, remote := pod4, netip.MustParseAddr("10.0.0.5")
			if v6 {
				own, remote = pod6, netip.MustParseAddr("fd00::5")
			}
			for _, uid := range append([]uint32{1000}, s.ProxyUIDs...) {
				for _, proto := range []Protocol{TCP, UDP} {
					pkts = append(pkts,
						trace.Packet{Direction: trace.Outbound, Src: own, Dst: remote, Proto: proto, SrcPort: 40000, DstPort: 53, OutIface: "eth0", UID: uid, GID: uid},
						trace.Packet{Direction: trace.Outbound, Src: own, Dst: own, Proto: proto, SrcPort: 40000, DstPort: 80, OutIface: "lo", UID: uid, GID: uid})
				}
			}
			pkts = append(pkts,
				trace.Packet{Direction: trace.Inbound, Src: remote, Dst: own, Proto: TCP, SrcPort: 40000, DstPort: 80, InIface: "eth0"},
				trace.Packet{Direction: trace.Inbound, Src: remote, Dst: own, Proto: TCP, SrcPort: 40000, DstPort: 80, InIface: "eth0", CTState: CTEstablished})
		}
		checkTraces(t, plan, pkts...)
		// Proxy traffic to a remote address never loops back to the proxy.
		for _, id := range s.ProxyUIDs {
			v, err := trace.Trace(plan, trace.Packet{Direction: trace.Outbound, Src: pod4, Dst: netip.MustParseAddr("10.0.0.5"), Proto: TCP, SrcPort: 40000, DstPort: 80, OutIface: "eth0", UID: id, GID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if v.Action == trace.Redirected && v.Port == s.ProxyPort {
				t.Fatalf("proxy uid %d loops back to the proxy:\n%s", id, v)
			}
		}
	})
}
