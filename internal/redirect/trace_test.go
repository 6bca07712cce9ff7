package redirect_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/trace"
)

// TestTraceMeaning states what each capture does to real traffic.
func TestTraceMeaning(t *testing.T) {
	tests := []struct {
		name string
		spec string
		pkt  trace.Packet
		want trace.Verdict
	}{
		// The default sidecar: inbound "*", outbound "*".
		{"app to a remote service goes to the outbound listener", "sidecar", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.RedirectTo(15001)},
		{"root app traffic is captured too", "sidecar", trace.Out(0, "10.0.0.5", 443), trace.RedirectTo(15001)},
		{"app UDP is not captured without DNS capture", "sidecar", trace.Out(trace.AppUID, "10.0.0.5", 5000, trace.WithUDP), trace.Pass()},
		{"proxy to a remote service leaves uncaptured", "sidecar", trace.Out(trace.ProxyUID, "10.0.0.5", 80), trace.Pass()},
		{"proxy identified by group only leaves uncaptured", "sidecar", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(trace.ProxyUID, "")), trace.Pass()},
		{"app to localhost is not captured", "sidecar", trace.Out(trace.AppUID, "127.0.0.1", 8080), trace.Pass()},
		{"app to its own pod IP over lo is not captured", "sidecar", trace.Out(trace.AppUID, "10.0.0.9", 8080), trace.Pass()},
		{"proxy to the pod's own IP over lo loops back to the inbound listener", "sidecar", trace.Out(trace.ProxyUID, "10.0.0.9", 8080), trace.RedirectTo(15006)},
		{"proxy to 127.0.0.5 over lo loops back: only 127.0.0.1/32 is loopback by default", "sidecar", trace.Out(trace.ProxyUID, "127.0.0.5", 8080), trace.RedirectTo(15006)},
		{"proxy to its own admin port on localhost passes", "sidecar", trace.Out(trace.ProxyUID, "127.0.0.1", 15000), trace.Pass()},
		{"proxy to the pod's own tunnel port is not looped back", "sidecar", trace.Out(trace.ProxyUID, "10.0.0.9", 15008), trace.Pass()},
		{"inbound passthrough from 127.0.0.6 to the app passes", "sidecar", trace.Out(trace.ProxyUID, "10.0.0.9", 8080, trace.WithSrc("127.0.0.6")), trace.Pass()},
		{"inbound TCP goes to the inbound listener", "sidecar", trace.In("10.1.1.1", 8080), trace.RedirectTo(15006)},
		{"inbound to the tunnel port 15008 passes", "sidecar", trace.In("10.1.1.1", 15008), trace.Pass()},
		{"inbound to the agent's port 15020 passes when excluded", "sidecar", trace.In("10.1.1.1", 15020), trace.Pass()},
		{"inbound to the health port 15021 passes when excluded", "sidecar", trace.In("10.1.1.1", 15021), trace.Pass()},
		{"inbound to Envoy's prometheus port 15090 passes when excluded", "sidecar", trace.In("10.1.1.1", 15090), trace.Pass()},
		{"inbound UDP is not captured", "sidecar", trace.In("10.1.1.1", 8080, trace.WithUDP), trace.Pass()},
		{"inbound established packet is not NATed again", "sidecar", trace.In("10.1.1.1", 8080, trace.WithState(CTEstablished)), trace.Pass()},
		{"inbound on lo is not NATed again at PREROUTING", "sidecar", trace.In("10.0.0.9", 8080, trace.WithIface("lo")), trace.Pass()},
		{"IPv6 is untouched when the capture is IPv4 only", "sidecar", trace.Out(trace.AppUID, "fd00::5", 80), trace.Pass()},

		{"empty spec captures no outbound traffic", "empty", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.Pass()},
		{"empty spec captures no inbound traffic", "empty", trace.In("10.1.1.1", 8080), trace.Pass()},

		{"custom proxy port receives outbound", "custom-ports", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.RedirectTo(15101)},
		{"custom inbound capture port receives inbound", "custom-ports", trace.In("10.1.1.1", 8080), trace.RedirectTo(15106)},
		{"custom tunnel port passes", "custom-ports", trace.In("10.1.1.1", 15108), trace.Pass()},
		{"default tunnel port is an ordinary port once the tunnel port moved", "custom-ports", trace.In("10.1.1.1", 15008), trace.RedirectTo(15106)},

		{"listed inbound port is captured", "inbound-ports", trace.In("10.1.1.1", 9090), trace.RedirectTo(15006)},
		{"unlisted inbound port passes", "inbound-ports", trace.In("10.1.1.1", 9091), trace.Pass()},
		{"inbound port list never captures the tunnel port", "inbound-ports", trace.In("10.1.1.1", 15008), trace.Pass()},

		{"included CIDR is captured", "outbound-cidr-include", trace.Out(trace.AppUID, "10.96.0.1", 443), trace.RedirectTo(15001)},
		{"included CIDR is masked: the last address of 10.96.0.0/12 is captured", "outbound-cidr-include", trace.Out(trace.AppUID, "10.111.255.255", 80), trace.RedirectTo(15001)},
		{"address just past the included CIDR passes", "outbound-cidr-include", trace.Out(trace.AppUID, "10.112.0.1", 80), trace.Pass()},
		{"destination outside the included CIDR passes", "outbound-cidr-include", trace.Out(trace.AppUID, "8.8.8.8", 443), trace.Pass()},

		{"excluded CIDR passes", "outbound-exclude", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.Pass()},
		{"excluded bare address passes", "outbound-exclude", trace.Out(trace.AppUID, "169.254.169.254", 80), trace.Pass()},
		{"address outside the excluded CIDRs is captured", "outbound-exclude", trace.Out(trace.AppUID, "10.0.1.5", 80), trace.RedirectTo(15001)},
		{"excluded outbound port passes", "outbound-exclude", trace.Out(trace.AppUID, "10.0.1.5", 6379), trace.Pass()},

		{"included outbound port is captured to any address", "outbound-ports-include", trace.Out(trace.AppUID, "8.8.8.8", 3306), trace.RedirectTo(15001)},
		{"second included outbound port is captured", "outbound-ports-include", trace.Out(trace.AppUID, "8.8.8.8", 5432), trace.RedirectTo(15001)},
		{"outbound port not included passes", "outbound-ports-include", trace.Out(trace.AppUID, "8.8.8.8", 80), trace.Pass()},

		{"outbound through an excluded interface passes", "exclude-interface", trace.Out(trace.AppUID, "192.168.1.5", 80, trace.WithIface("net1")), trace.Pass()},
		{"outbound through another interface is captured", "exclude-interface", trace.Out(trace.AppUID, "192.168.1.5", 80), trace.RedirectTo(15001)},
		{"inbound on an excluded interface passes", "exclude-interface", trace.In("192.168.1.1", 8080, trace.WithIface("net1")), trace.Pass()},
		{"inbound on another interface is captured", "exclude-interface", trace.In("10.1.1.1", 8080), trace.RedirectTo(15006)},

		{"VM traffic from a kubevirt interface goes to the outbound listener", "kubevirt", trace.In("10.1.1.1", 443, trace.WithIface("eth1"), trace.WithDst("8.8.8.8")), trace.RedirectTo(15001)},
		{"VM UDP from a kubevirt interface passes", "kubevirt", trace.In("10.1.1.1", 443, trace.WithIface("eth1"), trace.WithDst("8.8.8.8"), trace.WithUDP), trace.Pass()},
		{"inbound on the pod interface still goes to the inbound listener", "kubevirt", trace.In("10.1.1.1", 8080), trace.RedirectTo(15006)},
		{"VM traffic to an included CIDR goes to the outbound listener", "kubevirt-cidr", trace.In("10.1.1.1", 80, trace.WithIface("eth1"), trace.WithDst("10.2.3.4")), trace.RedirectTo(15001)},
		{"VM traffic outside the included CIDRs passes, and is not taken as inbound", "kubevirt-cidr", trace.In("10.1.1.1", 80, trace.WithIface("eth1"), trace.WithDst("8.8.8.8")), trace.Pass()},

		{"app UDP DNS to the resolver goes to the agent, in zone 2", "dns", trace.Out(trace.AppUID, "10.96.0.10", 53, trace.WithUDP), trace.RedirectTo(15053).InZone(2)},
		{"app TCP DNS to the resolver goes to the agent", "dns", trace.Out(trace.AppUID, "10.96.0.10", 53), trace.RedirectTo(15053)},
		{"agent's upstream DNS passes, in zone 1", "dns", trace.Out(trace.ProxyUID, "10.96.0.10", 53, trace.WithUDP), trace.Pass().InZone(1)},
		{"agent's answer to the app is in zone 2", "dns", trace.Out(trace.ProxyUID, "10.0.0.9", 40000, trace.WithUDP, trace.WithSport(15053), trace.WithState(CTEstablished)), trace.Pass().InZone(2)},
		{"resolver's answer to the agent is in zone 1", "dns", trace.In("10.96.0.10", 40000, trace.WithUDP, trace.WithSport(53), trace.WithState(CTEstablished)), trace.Pass().InZone(1)},
		{"app UDP DNS to another server is not captured", "dns", trace.Out(trace.AppUID, "8.8.8.8", 53, trace.WithUDP), trace.Pass()},
		{"app TCP DNS to another server goes to the outbound listener", "dns", trace.Out(trace.AppUID, "8.8.8.8", 53), trace.RedirectTo(15001)},
		{"capture-all: app UDP DNS to any server goes to the agent", "dns-capture-all", trace.Out(trace.AppUID, "8.8.8.8", 53, trace.WithUDP), trace.RedirectTo(15053).InZone(2)},
		{"capture-all: app TCP DNS to any server goes to the agent", "dns-capture-all", trace.Out(trace.AppUID, "1.1.1.1", 53), trace.RedirectTo(15053)},
		{"capture-all: agent's upstream DNS passes, in zone 1", "dns-capture-all", trace.Out(trace.ProxyUID, "8.8.8.8", 53, trace.WithUDP), trace.Pass().InZone(1)},
		{"capture-all: any resolver's answer is in zone 1", "dns-capture-all", trace.In("8.8.8.8", 40000, trace.WithUDP, trace.WithSport(53), trace.WithState(CTEstablished)), trace.Pass().InZone(1)},
		{"capture-all: agent's TCP DNS over lo is not looped back", "dns-capture-all", trace.Out(trace.ProxyUID, "10.0.0.9", 53), trace.Pass()},
		{"IPv6 app DNS to the IPv6 resolver goes to the agent, in zone 2", "dns-ipv6", trace.Out(trace.AppUID, "fd00:10:96::a", 53, trace.WithUDP), trace.RedirectTo(15053).InZone(2)},
		{"IPv6 agent DNS passes, in zone 1", "dns-ipv6", trace.Out(trace.ProxyUID, "fd00:10:96::a", 53, trace.WithUDP), trace.Pass().InZone(1)},
		{"IPv4 resolver is still captured with IPv6 on", "dns-ipv6", trace.Out(trace.AppUID, "10.96.0.10", 53, trace.WithUDP), trace.RedirectTo(15053).InZone(2)},
		{"DNS capture with no servers and not capture-all captures no DNS", "dns-no-servers", trace.Out(trace.AppUID, "10.96.0.10", 53, trace.WithUDP), trace.Pass()},

		{"owner groups include: other groups pass", "owner-groups-include", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(1000, "app")), trace.Pass()},
		{"owner groups include: a named group is captured", "owner-groups-include", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(2001, "java")), trace.RedirectTo(15001)},
		{"owner groups include: a numeric group is captured", "owner-groups-include", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(202, "")), trace.RedirectTo(15001)},
		{"owner groups include: supplementary groups do not count (xt_owner checks the fsgid)", "owner-groups-include", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(1000, "app"), trace.WithGroups("java", "202")), trace.Pass()},
		{"owner groups include: the proxy still passes", "owner-groups-include", trace.Out(trace.ProxyUID, "10.0.0.5", 80), trace.Pass()},
		{"owner groups include set but empty: no group is captured", "owner-groups-include-empty", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(1000, "app")), trace.Pass()},
		{"owner groups include set but empty: the proxy still passes", "owner-groups-include-empty", trace.Out(trace.ProxyUID, "10.0.0.5", 80), trace.Pass()},
		{"owner groups exclude: a numeric group passes", "owner-groups-exclude", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(888, "")), trace.Pass()},
		{"owner groups exclude: a named group passes", "owner-groups-exclude", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(21, "ftp")), trace.Pass()},
		{"owner groups exclude: other groups are captured", "owner-groups-exclude", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(1000, "app")), trace.RedirectTo(15001)},
		{"owner groups exclude: a supplementary excluded group does not exempt", "owner-groups-exclude", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(1000, "app"), trace.WithGroups("ftp", "888")), trace.RedirectTo(15001)},

		{"multi-uid: the second proxy uid leaves uncaptured", "multi-uid", trace.Out(4, "10.0.0.5", 80), trace.Pass()},
		{"multi-uid: a proxy gid leaves uncaptured", "multi-uid", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithGroup(2, "")), trace.Pass()},
		{"multi-uid: the first proxy uid loops back to inbound", "multi-uid", trace.Out(3, "10.0.0.9", 8080, trace.WithGroup(3, "")), trace.RedirectTo(15006)},
		// Istio's rules return lo traffic that is not from uid 3 before uid 4's loop-back rule.
		{"multi-uid: the second proxy uid is NOT looped back (Istio's per-uid rule order)", "multi-uid", trace.Out(4, "10.0.0.9", 8080, trace.WithGroup(4, "")), trace.Pass()},
		{"multi-uid: agent DNS by the second uid passes, in zone 1", "multi-uid", trace.Out(4, "10.96.0.10", 53, trace.WithUDP), trace.Pass().InZone(1)},

		{"loopback include: app to the included loopback address is captured", "loopback-include", trace.Out(trace.AppUID, "127.1.2.3", 80), trace.RedirectTo(15001)},
		{"loopback include: app to 127.0.0.1 passes", "loopback-include", trace.Out(trace.AppUID, "127.0.0.1", 80), trace.Pass()},
		{"host loopback /8: proxy to 127.0.0.5 is loopback and passes", "host-loopback-cidr", trace.Out(trace.ProxyUID, "127.0.0.5", 8080), trace.Pass()},
		{"host loopback /8: proxy to the pod IP still loops back", "host-loopback-cidr", trace.Out(trace.ProxyUID, "10.0.0.9", 8080), trace.RedirectTo(15006)},

		{"tproxy: inbound goes to the inbound listener with mark 1337", "tproxy", trace.In("10.1.1.1", 8080), trace.TProxyTo(15006, 1337)},
		{"tproxy: inbound established packet gets mark 1337 and is accepted", "tproxy", trace.In("10.1.1.1", 8080, trace.WithState(CTEstablished)), trace.Pass().Marked(1337)},
		{"tproxy: related packet gets mark 1337 too", "tproxy", trace.In("10.1.1.1", 8080, trace.WithState(CTRelated)), trace.Pass().Marked(1337)},
		{"tproxy: excluded inbound port passes", "tproxy", trace.In("10.1.1.1", 15020), trace.Pass()},
		// Istio's mangle rules have no tunnel-port exception: in TPROXY mode "*" takes 15008.
		{"tproxy: inbound \"*\" takes the tunnel port too (as Istio's rules do)", "tproxy", trace.In("10.1.1.1", 15008), trace.TProxyTo(15006, 1337)},
		{"tproxy: inbound passthrough from 127.0.0.6 on lo passes", "tproxy", trace.In("127.0.0.6", 8080, trace.WithIface("lo")), trace.Pass()},
		{"tproxy: app-to-self on lo without mark 1338 passes", "tproxy", trace.In("10.0.0.9", 8080, trace.WithIface("lo")), trace.Pass()},
		{"tproxy: an already marked packet is not proxied again and its mark is saved", "tproxy", trace.In("10.1.1.1", 8080, trace.WithMark(1337)), trace.Pass().Marked(1337).ConnMarked(1337)},
		{"tproxy: proxy to the pod IP over lo is marked 1338 and loops back", "tproxy", trace.Out(trace.ProxyUID, "10.0.0.9", 8080), trace.RedirectTo(15006).Marked(OutboundMark)},
		{"tproxy: app outbound still goes to the outbound listener", "tproxy", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.RedirectTo(15001)},
		{"tproxy: proxy reply restores connection mark 1337 for policy routing", "tproxy", trace.Out(trace.ProxyUID, "10.1.1.1", 50000, trace.WithState(CTEstablished), trace.WithConnMark(1337)), trace.Pass().Marked(1337).ConnMarked(1337)},
		{"tproxy port list: listed port is proxied", "tproxy-ports", trace.In("10.1.1.1", 8080), trace.TProxyTo(15006, 1337)},
		{"tproxy port list: tunnel port passes", "tproxy-ports", trace.In("10.1.1.1", 15008), trace.Pass()},
		{"tproxy port list: other ports pass", "tproxy-ports", trace.In("10.1.1.1", 9090), trace.Pass()},
		{"tproxy IPv6: inbound goes to the inbound listener", "tproxy-ipv6", trace.In("fd00::1", 8080), trace.TProxyTo(15006, 1337)},
		{"tproxy IPv6: inbound on an excluded interface passes", "tproxy-ipv6", trace.In("fd00::1", 8080, trace.WithIface("net1")), trace.Pass()},
		{"tproxy IPv6: passthrough from ::6 on lo passes", "tproxy-ipv6", trace.In("::6", 8080, trace.WithIface("lo")), trace.Pass()},
		// TPROXY assigns the socket in mangle; the later nat REDIRECT cannot move it.
		{"tproxy kubevirt: VM traffic is taken by TPROXY before the nat redirect", "tproxy-kubevirt", trace.In("10.1.1.1", 443, trace.WithIface("eth1"), trace.WithDst("8.8.8.8")), trace.TProxyTo(15006, 1337)},

		{"drop invalid: invalid inbound packet is dropped", "drop-invalid", trace.In("10.1.1.1", 8080, trace.WithState(CTInvalid)), trace.Drop()},
		{"drop invalid: new inbound packet is captured", "drop-invalid", trace.In("10.1.1.1", 8080), trace.RedirectTo(15006)},
		{"drop invalid: invalid outbound packet is not dropped", "drop-invalid", trace.Out(trace.AppUID, "10.0.0.5", 80, trace.WithState(CTInvalid)), trace.Pass()},
		{"without drop invalid, an invalid inbound packet passes", "sidecar", trace.In("10.1.1.1", 8080, trace.WithState(CTInvalid)), trace.Pass()},

		{"IPv6 app to a remote service goes to the outbound listener", "sidecar-ipv6", trace.Out(trace.AppUID, "fd00::5", 80), trace.RedirectTo(15001)},
		{"IPv6 proxy to a remote service passes", "sidecar-ipv6", trace.Out(trace.ProxyUID, "fd00::5", 80), trace.Pass()},
		{"IPv6 app to ::1 passes", "sidecar-ipv6", trace.Out(trace.AppUID, "::1", 8080), trace.Pass()},
		{"IPv6 proxy to the pod's own IP loops back to inbound", "sidecar-ipv6", trace.Out(trace.ProxyUID, "fd00::9", 8080), trace.RedirectTo(15006)},
		{"IPv6 inbound passthrough from ::6 passes", "sidecar-ipv6", trace.Out(trace.ProxyUID, "fd00::9", 8080, trace.WithSrc("::6")), trace.Pass()},
		{"IPv6 passthrough needs ::6 exactly: ::7 loops back", "sidecar-ipv6", trace.Out(trace.ProxyUID, "fd00::9", 8080, trace.WithSrc("::7")), trace.RedirectTo(15006)},
		{"IPv6 inbound goes to the inbound listener", "sidecar-ipv6", trace.In("fd00::1", 8080), trace.RedirectTo(15006)},
		{"IPv6 inbound to the tunnel port passes", "sidecar-ipv6", trace.In("fd00::1", 15008), trace.Pass()},
		{"IPv6 inbound to an excluded port passes", "sidecar-ipv6", trace.In("fd00::1", 15021), trace.Pass()},
		{"IPv4 is still captured with IPv6 on", "sidecar-ipv6", trace.Out(trace.AppUID, "10.0.0.5", 80), trace.RedirectTo(15001)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := casePlan(t, tt.spec)
			got, err := trace.Trace(p, tt.pkt)
			if err != nil {
				t.Fatalf("Trace(%s): %v", tt.pkt, err)
			}
			if diff := cmp.Diff(tt.want, got, trace.IgnoreTrace); diff != "" {
				t.Errorf("spec %s, %s (-want +got):\n%s\ntrace: %s", tt.spec, tt.pkt, diff, got)
			}
		})
	}
}

// TestTraceRecordsTheRulesHit checks the debugging output names the rules in order.
func TestTraceRecordsTheRulesHit(t *testing.T) {
	v, err := trace.Trace(casePlan(t, "sidecar"), trace.Out(trace.AppUID, "10.0.0.5", 80))
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
	v, err := trace.Trace(casePlan(t, "dns"), trace.Out(trace.ProxyUID, "10.96.0.10", 53, trace.WithUDP))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.String(), "CT --zone 2 ignored") {
		t.Errorf("proxy DNS trace does not note the ignored zone 2 rule:\n%s", v)
	}
	v, err = trace.Trace(casePlan(t, "sidecar"), trace.In("10.1.1.1", 8080, trace.WithState(CTEstablished)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.String(), "only a connection's first packet is NATed") {
		t.Errorf("established trace does not say why nat was skipped:\n%s", v)
	}
}
