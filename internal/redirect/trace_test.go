package redirect_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/trace"
)

// The pod the packets belong to.
var (
	pod4 = netip.MustParseAddr("10.0.0.9")
	pod6 = netip.MustParseAddr("fd00::9")
)

const (
	appUID   = 1000
	proxyUID = DefaultProxyUID
)

type pktMod func(*trace.Packet)

// out is a TCP connection's first packet sent by uid (gid = uid) to dst:dport. It
// leaves through lo when dst is local (loopback or the pod's own address), else eth0.
func out(uid uint32, dst string, dport uint16, mods ...pktMod) trace.Packet {
	d := netip.MustParseAddr(dst)
	p := trace.Packet{Direction: trace.Outbound, Dst: d, Proto: TCP, SrcPort: 40000, DstPort: dport, UID: uid, GID: uid, OutIface: "eth0"}
	switch {
	case d.Is4() && d.IsLoopback():
		p.Src, p.OutIface = netip.MustParseAddr("127.0.0.1"), "lo"
	case d.IsLoopback():
		p.Src, p.OutIface = d, "lo"
	case d.Is4():
		p.Src = pod4
	default:
		p.Src = pod6
	}
	if d == pod4 || d == pod6 {
		p.OutIface = "lo"
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

// in is a TCP connection's first packet from src arriving on eth0 for the pod's port.
func in(src string, dport uint16, mods ...pktMod) trace.Packet {
	s := netip.MustParseAddr(src)
	p := trace.Packet{Direction: trace.Inbound, Src: s, Dst: pod4, Proto: TCP, SrcPort: 50000, DstPort: dport, InIface: "eth0"}
	if s.Is6() {
		p.Dst = pod6
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

func withUDP(p *trace.Packet) { p.Proto = UDP }
func withIface(name string) pktMod {
	return func(p *trace.Packet) { p.OutIface, p.InIface = mapIface(p, name) }
}
func withSrc(a string) pktMod        { return func(p *trace.Packet) { p.Src = netip.MustParseAddr(a) } }
func withDst(a string) pktMod        { return func(p *trace.Packet) { p.Dst = netip.MustParseAddr(a) } }
func withSport(port uint16) pktMod   { return func(p *trace.Packet) { p.SrcPort = port } }
func withState(s CTState) pktMod     { return func(p *trace.Packet) { p.CTState = s } }
func withMark(m uint32) pktMod       { return func(p *trace.Packet) { p.Mark = m } }
func withConnMark(m uint32) pktMod   { return func(p *trace.Packet) { p.ConnMark = m } }
func withGroups(gs ...string) pktMod { return func(p *trace.Packet) { p.Groups = gs } }
func withGroup(gid uint32, name string) pktMod {
	return func(p *trace.Packet) { p.GID, p.GroupName = gid, name }
}

func mapIface(p *trace.Packet, name string) (out, in string) {
	if p.Direction == trace.Outbound {
		return name, ""
	}
	return "", name
}

// verdict is an expected trace.Verdict, built up by the helpers below.
type verdict trace.Verdict

func passed() verdict                { return verdict{Action: trace.Passed} }
func redirected(port uint16) verdict { return verdict{Action: trace.Redirected, Port: port} }
func tproxied(port uint16, m uint32) verdict {
	return verdict{Action: trace.TProxied, Port: port, Mark: m}
}
func dropped() verdict                        { return verdict{Action: trace.Dropped} }
func (v verdict) zone(z uint16) verdict       { v.Zone = z; return v }
func (v verdict) marked(m uint32) verdict     { v.Mark = m; return v }
func (v verdict) connMarked(m uint32) verdict { v.ConnMark = m; return v }

var ignoreTrace = cmpopts.IgnoreFields(trace.Verdict{}, "Trace")

// TestTraceMeaning states what each capture does to real traffic.
func TestTraceMeaning(t *testing.T) {
	tests := []struct {
		name string
		spec string
		pkt  trace.Packet
		want verdict
	}{
		// The default sidecar: inbound "*", outbound "*".
		{"app to a remote service goes to the outbound listener", "sidecar", out(appUID, "10.0.0.5", 80), redirected(15001)},
		{"root app traffic is captured too", "sidecar", out(0, "10.0.0.5", 443), redirected(15001)},
		{"app UDP is not captured without DNS capture", "sidecar", out(appUID, "10.0.0.5", 5000, withUDP), passed()},
		{"proxy to a remote service leaves uncaptured", "sidecar", out(proxyUID, "10.0.0.5", 80), passed()},
		{"proxy identified by group only leaves uncaptured", "sidecar", out(appUID, "10.0.0.5", 80, withGroup(proxyUID, "")), passed()},
		{"app to localhost is not captured", "sidecar", out(appUID, "127.0.0.1", 8080), passed()},
		{"app to its own pod IP over lo is not captured", "sidecar", out(appUID, "10.0.0.9", 8080), passed()},
		{"proxy to the pod's own IP over lo loops back to the inbound listener", "sidecar", out(proxyUID, "10.0.0.9", 8080), redirected(15006)},
		{"proxy to 127.0.0.5 over lo loops back: only 127.0.0.1/32 is loopback by default", "sidecar", out(proxyUID, "127.0.0.5", 8080), redirected(15006)},
		{"proxy to its own admin port on localhost passes", "sidecar", out(proxyUID, "127.0.0.1", 15000), passed()},
		{"proxy to the pod's own tunnel port is not looped back", "sidecar", out(proxyUID, "10.0.0.9", 15008), passed()},
		{"inbound passthrough from 127.0.0.6 to the app passes", "sidecar", out(proxyUID, "10.0.0.9", 8080, withSrc("127.0.0.6")), passed()},
		{"inbound TCP goes to the inbound listener", "sidecar", in("10.1.1.1", 8080), redirected(15006)},
		{"inbound to the tunnel port 15008 passes", "sidecar", in("10.1.1.1", 15008), passed()},
		{"inbound to the agent's port 15020 passes when excluded", "sidecar", in("10.1.1.1", 15020), passed()},
		{"inbound to the health port 15021 passes when excluded", "sidecar", in("10.1.1.1", 15021), passed()},
		{"inbound to Envoy's prometheus port 15090 passes when excluded", "sidecar", in("10.1.1.1", 15090), passed()},
		{"inbound UDP is not captured", "sidecar", in("10.1.1.1", 8080, withUDP), passed()},
		{"inbound established packet is not NATed again", "sidecar", in("10.1.1.1", 8080, withState(CTEstablished)), passed()},
		{"inbound on lo is not NATed again at PREROUTING", "sidecar", in("10.0.0.9", 8080, withIface("lo")), passed()},
		{"IPv6 is untouched when the capture is IPv4 only", "sidecar", out(appUID, "fd00::5", 80), passed()},

		{"empty spec captures no outbound traffic", "empty", out(appUID, "10.0.0.5", 80), passed()},
		{"empty spec captures no inbound traffic", "empty", in("10.1.1.1", 8080), passed()},

		{"custom proxy port receives outbound", "custom-ports", out(appUID, "10.0.0.5", 80), redirected(15101)},
		{"custom inbound capture port receives inbound", "custom-ports", in("10.1.1.1", 8080), redirected(15106)},
		{"custom tunnel port passes", "custom-ports", in("10.1.1.1", 15108), passed()},
		{"default tunnel port is an ordinary port once the tunnel port moved", "custom-ports", in("10.1.1.1", 15008), redirected(15106)},

		{"listed inbound port is captured", "inbound-ports", in("10.1.1.1", 9090), redirected(15006)},
		{"unlisted inbound port passes", "inbound-ports", in("10.1.1.1", 9091), passed()},
		{"inbound port list never captures the tunnel port", "inbound-ports", in("10.1.1.1", 15008), passed()},

		{"included CIDR is captured", "outbound-cidr-include", out(appUID, "10.96.0.1", 443), redirected(15001)},
		{"included CIDR is masked: the last address of 10.96.0.0/12 is captured", "outbound-cidr-include", out(appUID, "10.111.255.255", 80), redirected(15001)},
		{"address just past the included CIDR passes", "outbound-cidr-include", out(appUID, "10.112.0.1", 80), passed()},
		{"destination outside the included CIDR passes", "outbound-cidr-include", out(appUID, "8.8.8.8", 443), passed()},

		{"excluded CIDR passes", "outbound-exclude", out(appUID, "10.0.0.5", 80), passed()},
		{"excluded bare address passes", "outbound-exclude", out(appUID, "169.254.169.254", 80), passed()},
		{"address outside the excluded CIDRs is captured", "outbound-exclude", out(appUID, "10.0.1.5", 80), redirected(15001)},
		{"excluded outbound port passes", "outbound-exclude", out(appUID, "10.0.1.5", 6379), passed()},

		{"included outbound port is captured to any address", "outbound-ports-include", out(appUID, "8.8.8.8", 3306), redirected(15001)},
		{"second included outbound port is captured", "outbound-ports-include", out(appUID, "8.8.8.8", 5432), redirected(15001)},
		{"outbound port not included passes", "outbound-ports-include", out(appUID, "8.8.8.8", 80), passed()},

		{"outbound through an excluded interface passes", "exclude-interface", out(appUID, "192.168.1.5", 80, withIface("net1")), passed()},
		{"outbound through another interface is captured", "exclude-interface", out(appUID, "192.168.1.5", 80), redirected(15001)},
		{"inbound on an excluded interface passes", "exclude-interface", in("192.168.1.1", 8080, withIface("net1")), passed()},
		{"inbound on another interface is captured", "exclude-interface", in("10.1.1.1", 8080), redirected(15006)},

		{"VM traffic from a kubevirt interface goes to the outbound listener", "kubevirt", in("10.1.1.1", 443, withIface("eth1"), withDst("8.8.8.8")), redirected(15001)},
		{"VM UDP from a kubevirt interface passes", "kubevirt", in("10.1.1.1", 443, withIface("eth1"), withDst("8.8.8.8"), withUDP), passed()},
		{"inbound on the pod interface still goes to the inbound listener", "kubevirt", in("10.1.1.1", 8080), redirected(15006)},
		{"VM traffic to an included CIDR goes to the outbound listener", "kubevirt-cidr", in("10.1.1.1", 80, withIface("eth1"), withDst("10.2.3.4")), redirected(15001)},
		{"VM traffic outside the included CIDRs passes, and is not taken as inbound", "kubevirt-cidr", in("10.1.1.1", 80, withIface("eth1"), withDst("8.8.8.8")), passed()},

		{"app UDP DNS to the resolver goes to the agent, in zone 2", "dns", out(appUID, "10.96.0.10", 53, withUDP), redirected(15053).zone(2)},
		{"app TCP DNS to the resolver goes to the agent", "dns", out(appUID, "10.96.0.10", 53), redirected(15053)},
		{"agent's upstream DNS passes, in zone 1", "dns", out(proxyUID, "10.96.0.10", 53, withUDP), passed().zone(1)},
		{"agent's answer to the app is in zone 2", "dns", out(proxyUID, "10.0.0.9", 40000, withUDP, withSport(15053), withState(CTEstablished)), passed().zone(2)},
		{"resolver's answer to the agent is in zone 1", "dns", in("10.96.0.10", 40000, withUDP, withSport(53), withState(CTEstablished)), passed().zone(1)},
		{"app UDP DNS to another server is not captured", "dns", out(appUID, "8.8.8.8", 53, withUDP), passed()},
		{"app TCP DNS to another server goes to the outbound listener", "dns", out(appUID, "8.8.8.8", 53), redirected(15001)},
		{"capture-all: app UDP DNS to any server goes to the agent", "dns-capture-all", out(appUID, "8.8.8.8", 53, withUDP), redirected(15053).zone(2)},
		{"capture-all: app TCP DNS to any server goes to the agent", "dns-capture-all", out(appUID, "1.1.1.1", 53), redirected(15053)},
		{"capture-all: agent's upstream DNS passes, in zone 1", "dns-capture-all", out(proxyUID, "8.8.8.8", 53, withUDP), passed().zone(1)},
		{"capture-all: any resolver's answer is in zone 1", "dns-capture-all", in("8.8.8.8", 40000, withUDP, withSport(53), withState(CTEstablished)), passed().zone(1)},
		{"capture-all: agent's TCP DNS over lo is not looped back", "dns-capture-all", out(proxyUID, "10.0.0.9", 53), passed()},
		{"IPv6 app DNS to the IPv6 resolver goes to the agent, in zone 2", "dns-ipv6", out(appUID, "fd00:10:96::a", 53, withUDP), redirected(15053).zone(2)},
		{"IPv6 agent DNS passes, in zone 1", "dns-ipv6", out(proxyUID, "fd00:10:96::a", 53, withUDP), passed().zone(1)},
		{"IPv4 resolver is still captured with IPv6 on", "dns-ipv6", out(appUID, "10.96.0.10", 53, withUDP), redirected(15053).zone(2)},
		{"DNS capture with no servers and not capture-all captures no DNS", "dns-no-servers", out(appUID, "10.96.0.10", 53, withUDP), passed()},

		{"owner groups include: other groups pass", "owner-groups-include", out(appUID, "10.0.0.5", 80, withGroup(1000, "app")), passed()},
		{"owner groups include: a named group is captured", "owner-groups-include", out(appUID, "10.0.0.5", 80, withGroup(2001, "java")), redirected(15001)},
		{"owner groups include: a numeric group is captured", "owner-groups-include", out(appUID, "10.0.0.5", 80, withGroup(202, "")), redirected(15001)},
		{"owner groups include: supplementary groups do not count (xt_owner checks the fsgid)", "owner-groups-include", out(appUID, "10.0.0.5", 80, withGroup(1000, "app"), withGroups("java", "202")), passed()},
		{"owner groups include: the proxy still passes", "owner-groups-include", out(proxyUID, "10.0.0.5", 80), passed()},
		{"owner groups exclude: a numeric group passes", "owner-groups-exclude", out(appUID, "10.0.0.5", 80, withGroup(888, "")), passed()},
		{"owner groups exclude: a named group passes", "owner-groups-exclude", out(appUID, "10.0.0.5", 80, withGroup(21, "ftp")), passed()},
		{"owner groups exclude: other groups are captured", "owner-groups-exclude", out(appUID, "10.0.0.5", 80, withGroup(1000, "app")), redirected(15001)},
		{"owner groups exclude: a supplementary excluded group does not exempt", "owner-groups-exclude", out(appUID, "10.0.0.5", 80, withGroup(1000, "app"), withGroups("ftp", "888")), redirected(15001)},

		{"multi-uid: the second proxy uid leaves uncaptured", "multi-uid", out(4, "10.0.0.5", 80), passed()},
		{"multi-uid: a proxy gid leaves uncaptured", "multi-uid", out(appUID, "10.0.0.5", 80, withGroup(2, "")), passed()},
		{"multi-uid: the first proxy uid loops back to inbound", "multi-uid", out(3, "10.0.0.9", 8080, withGroup(3, "")), redirected(15006)},
		// Istio's rules return lo traffic that is not from uid 3 before uid 4's loop-back rule.
		{"multi-uid: the second proxy uid is NOT looped back (Istio's per-uid rule order)", "multi-uid", out(4, "10.0.0.9", 8080, withGroup(4, "")), passed()},
		{"multi-uid: agent DNS by the second uid passes, in zone 1", "multi-uid", out(4, "10.96.0.10", 53, withUDP), passed().zone(1)},

		{"loopback include: app to the included loopback address is captured", "loopback-include", out(appUID, "127.1.2.3", 80), redirected(15001)},
		{"loopback include: app to 127.0.0.1 passes", "loopback-include", out(appUID, "127.0.0.1", 80), passed()},
		{"host loopback /8: proxy to 127.0.0.5 is loopback and passes", "host-loopback-cidr", out(proxyUID, "127.0.0.5", 8080), passed()},
		{"host loopback /8: proxy to the pod IP still loops back", "host-loopback-cidr", out(proxyUID, "10.0.0.9", 8080), redirected(15006)},

		{"tproxy: inbound goes to the inbound listener with mark 1337", "tproxy", in("10.1.1.1", 8080), tproxied(15006, 1337)},
		{"tproxy: inbound established packet gets mark 1337 and is accepted", "tproxy", in("10.1.1.1", 8080, withState(CTEstablished)), passed().marked(1337)},
		{"tproxy: related packet gets mark 1337 too", "tproxy", in("10.1.1.1", 8080, withState(CTRelated)), passed().marked(1337)},
		{"tproxy: excluded inbound port passes", "tproxy", in("10.1.1.1", 15020), passed()},
		// Istio's mangle rules have no tunnel-port exception: in TPROXY mode "*" takes 15008.
		{"tproxy: inbound \"*\" takes the tunnel port too (as Istio's rules do)", "tproxy", in("10.1.1.1", 15008), tproxied(15006, 1337)},
		{"tproxy: inbound passthrough from 127.0.0.6 on lo passes", "tproxy", in("127.0.0.6", 8080, withIface("lo")), passed()},
		{"tproxy: app-to-self on lo without mark 1338 passes", "tproxy", in("10.0.0.9", 8080, withIface("lo")), passed()},
		{"tproxy: an already marked packet is not proxied again and its mark is saved", "tproxy", in("10.1.1.1", 8080, withMark(1337)), passed().marked(1337).connMarked(1337)},
		{"tproxy: proxy to the pod IP over lo is marked 1338 and loops back", "tproxy", out(proxyUID, "10.0.0.9", 8080), redirected(15006).marked(OutboundMark)},
		{"tproxy: app outbound still goes to the outbound listener", "tproxy", out(appUID, "10.0.0.5", 80), redirected(15001)},
		{"tproxy: proxy reply restores connection mark 1337 for policy routing", "tproxy", out(proxyUID, "10.1.1.1", 50000, withState(CTEstablished), withConnMark(1337)), passed().marked(1337).connMarked(1337)},
		{"tproxy port list: listed port is proxied", "tproxy-ports", in("10.1.1.1", 8080), tproxied(15006, 1337)},
		{"tproxy port list: tunnel port passes", "tproxy-ports", in("10.1.1.1", 15008), passed()},
		{"tproxy port list: other ports pass", "tproxy-ports", in("10.1.1.1", 9090), passed()},
		{"tproxy IPv6: inbound goes to the inbound listener", "tproxy-ipv6", in("fd00::1", 8080), tproxied(15006, 1337)},
		{"tproxy IPv6: inbound on an excluded interface passes", "tproxy-ipv6", in("fd00::1", 8080, withIface("net1")), passed()},
		{"tproxy IPv6: passthrough from ::6 on lo passes", "tproxy-ipv6", in("::6", 8080, withIface("lo")), passed()},
		// TPROXY assigns the socket in mangle; the later nat REDIRECT cannot move it.
		{"tproxy kubevirt: VM traffic is taken by TPROXY before the nat redirect", "tproxy-kubevirt", in("10.1.1.1", 443, withIface("eth1"), withDst("8.8.8.8")), tproxied(15006, 1337)},

		{"drop invalid: invalid inbound packet is dropped", "drop-invalid", in("10.1.1.1", 8080, withState(CTInvalid)), dropped()},
		{"drop invalid: new inbound packet is captured", "drop-invalid", in("10.1.1.1", 8080), redirected(15006)},
		{"drop invalid: invalid outbound packet is not dropped", "drop-invalid", out(appUID, "10.0.0.5", 80, withState(CTInvalid)), passed()},
		{"without drop invalid, an invalid inbound packet passes", "sidecar", in("10.1.1.1", 8080, withState(CTInvalid)), passed()},

		{"IPv6 app to a remote service goes to the outbound listener", "sidecar-ipv6", out(appUID, "fd00::5", 80), redirected(15001)},
		{"IPv6 proxy to a remote service passes", "sidecar-ipv6", out(proxyUID, "fd00::5", 80), passed()},
		{"IPv6 app to ::1 passes", "sidecar-ipv6", out(appUID, "::1", 8080), passed()},
		{"IPv6 proxy to the pod's own IP loops back to inbound", "sidecar-ipv6", out(proxyUID, "fd00::9", 8080), redirected(15006)},
		{"IPv6 inbound passthrough from ::6 passes", "sidecar-ipv6", out(proxyUID, "fd00::9", 8080, withSrc("::6")), passed()},
		{"IPv6 passthrough needs ::6 exactly: ::7 loops back", "sidecar-ipv6", out(proxyUID, "fd00::9", 8080, withSrc("::7")), redirected(15006)},
		{"IPv6 inbound goes to the inbound listener", "sidecar-ipv6", in("fd00::1", 8080), redirected(15006)},
		{"IPv6 inbound to the tunnel port passes", "sidecar-ipv6", in("fd00::1", 15008), passed()},
		{"IPv6 inbound to an excluded port passes", "sidecar-ipv6", in("fd00::1", 15021), passed()},
		{"IPv4 is still captured with IPv6 on", "sidecar-ipv6", out(appUID, "10.0.0.5", 80), redirected(15001)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := casePlan(t, tt.spec)
			got, err := trace.Trace(p, tt.pkt)
			if err != nil {
				t.Fatalf("Trace(%s): %v", tt.pkt, err)
			}
			if diff := cmp.Diff(trace.Verdict(tt.want), got, ignoreTrace); diff != "" {
				t.Errorf("spec %s, %s (-want +got):\n%s\ntrace: %s", tt.spec, tt.pkt, diff, got)
			}
		})
	}
}

// TestTraceRecordsTheRulesHit checks the debugging output names the rules in order.
func TestTraceRecordsTheRulesHit(t *testing.T) {
	v, err := trace.Trace(casePlan(t, "sidecar"), out(appUID, "10.0.0.5", 80))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range v.Trace {
		got = append(got, s.String())
	}
	want := []string{
		"nat OUTPUT #1: -j ISTIO_OUTPUT",
		"nat ISTIO_OUTPUT #9: -j ISTIO_REDIRECT",
		"nat ISTIO_REDIRECT #1: -p tcp -j REDIRECT --to-ports 15001",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trace (-want +got):\n%s", diff)
	}
	if s := v.String(); !strings.HasPrefix(s, "redirected to port 15001 (mark 0, connmark 0, zone 0)\n  nat OUTPUT #1") {
		t.Errorf("String() = %q", s)
	}
}

// TestTraceNotesWhatTheKernelDecidesWithoutRules checks the notes for skipped nat and
// ignored CT targets.
func TestTraceNotesWhatTheKernelDecidesWithoutRules(t *testing.T) {
	v, err := trace.Trace(casePlan(t, "dns"), out(proxyUID, "10.96.0.10", 53, withUDP))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.String(), "CT --zone 2 ignored") {
		t.Errorf("proxy DNS trace does not note the ignored zone 2 rule:\n%s", v)
	}
	v, err = trace.Trace(casePlan(t, "sidecar"), in("10.1.1.1", 8080, withState(CTEstablished)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.String(), "only a connection's first packet is NATed") {
		t.Errorf("established trace does not say why nat was skipped:\n%s", v)
	}
}
