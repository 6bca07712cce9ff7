package capture_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// The test binary doubles as the client that sends traffic under a chosen uid/gid:
// Go cannot change credentials per goroutine, so each probe runs as a child process.
func TestMain(m *testing.M) {
	sandbox.RunChildIfAsked()
	exe, dir, err := sandbox.ExecutableCopy()
	if err != nil {
		fmt.Fprintln(os.Stderr, "copy test binary:", err)
		os.Exit(1)
	}
	selfCopy = exe
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var selfCopy string

var (
	podV4    = sandbox.PodV4
	podV6    = sandbox.PodV6
	peerV6   = sandbox.PeerV6
	routedV4 = sandbox.RoutedV4
	routedV6 = sandbox.RoutedV6
)

const (
	appUID   = 1000
	proxyUID = 1337
)

type flow struct {
	name  string
	from  string // "app", "proxy" (pod, by uid) or "peer" (inbound)
	proto string // tcp, tcp6, udp, udp6
	dst   netip.AddrPort
	want  string // answer prefix: "outbound ORIG", "inbound ORIG", "dns", "peer", "app ..."
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

var (
	resolver4 = sandbox.PeerV4 // the peer plays the cluster DNS
	external4 = sandbox.PeerV4
)

// trafficCase is a plan's settings and flows that land where it says.
type trafficCase struct {
	name  string
	opts  specs.Settings
	flows []flow
}

// trafficCases drive every backend with real traffic and check where it lands.
var trafficCases = []trafficCase{
	{
		name: "default sidecar",
		opts: specs.Sidecar(),
		flows: []flow{
			{"app outbound is captured with its original destination", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
			{"proxy outbound is not captured", "proxy", "tcp", ap(external4, 80), "peer"},
			{"app to localhost is not captured", "app", "tcp", ap(netip.MustParseAddr("127.0.0.1"), 8080), "app"},
			{"excluded outbound port is not captured", "app", "tcp", ap(external4, 15020), "peer15020"},
			{"inbound is captured with its original destination", "peer", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"inbound to the tunnel port is not captured", "peer", "tcp", ap(podV4, 15008), "tunnel"},
			{"inbound to an excluded port is not captured", "peer", "tcp", ap(podV4, 15021), "health"},
			{"proxy calling its own pod IP goes through inbound capture", "proxy", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"app calling its own pod IP is not captured", "app", "tcp", ap(podV4, 8080), "app"},
		},
	},
	{
		name: "exclusions and DNS",
		opts: specs.Settings{redirect.FieldInboundPorts: "8080", redirect.FieldOutboundCIDRs: "*", redirect.FieldOutboundCIDRsExclude: "10.88.0.1/32", redirect.FieldRedirectDNS: "true", redirect.FieldDNSServers: "10.99.0.10"},
		flows: []flow{
			{"excluded CIDR is not captured", "app", "tcp", ap(external4, 80), "peer"},
			{"other destinations are captured", "app", "tcp", ap(netip.MustParseAddr("10.77.0.9"), 443), "outbound 10.77.0.9:443"},
			{"DNS over UDP to the resolver goes to the agent", "app", "udp", ap(netip.MustParseAddr("10.99.0.10"), 53), "dns"},
			{"DNS over TCP to the resolver goes to the agent", "app", "tcp", ap(netip.MustParseAddr("10.99.0.10"), 53), "dnstcp"},
			{"the agent's own DNS query is not captured", "proxy", "udp", ap(resolver4, 53), "peerdns"},
			{"inbound on a listed port is captured", "peer", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"inbound on an unlisted port is not captured", "peer", "tcp", ap(podV4, 9090), "app9090"},
		},
	},
	{
		name: "TPROXY inbound",
		opts: specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*"},
		flows: []flow{
			{"inbound is transparently proxied, destination preserved", "peer", "tcp", ap(podV4, 8080), "tproxy 10.88.0.2:8080"},
			{"inbound to an address routed to the pod reaches the proxy by the policy routing", "peer", "tcp", ap(routedV4, 8080), "tproxy 10.66.0.9:8080"},
			{"outbound still uses REDIRECT", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
		},
	},
	{
		name: "IPv6",
		opts: specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldIPv6: "true"},
		flows: []flow{
			{"IPv6 outbound is captured", "app", "tcp6", ap(peerV6, 80), "outbound [fd88::1]:80"},
			{"IPv6 proxy outbound is not captured", "proxy", "tcp6", ap(peerV6, 80), "peer"},
			{"IPv6 inbound is captured", "peer", "tcp6", ap(podV6, 8080), "inbound [fd88::2]:8080"},
			{"IPv4 outbound is captured too", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
		},
	},
	{
		name: "TPROXY with exclusions, loopback and IPv6",
		opts: specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldInboundPortsExclude: "15021", redirect.FieldOutboundCIDRs: "*", redirect.FieldOutboundCIDRsExclude: "10.88.0.1/32", redirect.FieldIPv6: "true"},
		flows: []flow{
			{"inbound to an excluded port is not captured", "peer", "tcp", ap(podV4, 15021), "health"},
			// Istio's mangle rules have no tunnel-port exception: in TPROXY mode "*" takes 15008.
			{"inbound to the tunnel port is proxied too", "peer", "tcp", ap(podV4, 15008), "tproxy 10.88.0.2:15008"},
			{"IPv6 inbound is transparently proxied", "peer", "tcp6", ap(podV6, 8080), "tproxy [fd88::2]:8080"},
			{"inbound to an address routed to the pod reaches the proxy by the policy routing", "peer", "tcp", ap(routedV4, 8080), "tproxy 10.66.0.9:8080"},
			{"IPv6 inbound to an address routed to the pod reaches the proxy by the policy routing", "peer", "tcp6", ap(routedV6, 8080), "tproxy [fd66::9]:8080"},
			{"proxy calling its own pod IP goes through inbound capture", "proxy", "tcp", ap(podV4, 8080), "tproxy 10.88.0.2:8080"},
			{"IPv6 proxy calling its own pod IP goes through inbound capture", "proxy", "tcp6", ap(podV6, 8080), "tproxy [fd88::2]:8080"},
			{"app calling its own pod IP is not captured", "app", "tcp", ap(podV4, 8080), "app 10.88.0.2:8080"},
			{"app to localhost is not captured", "app", "tcp", ap(netip.MustParseAddr("127.0.0.1"), 8080), "app 127.0.0.1:8080"},
			{"IPv6 app to localhost is not captured", "app", "tcp6", ap(netip.IPv6Loopback(), 8080), "app [::1]:8080"},
			{"app to a local port nobody listens on is refused", "app", "tcp", ap(netip.MustParseAddr("127.0.0.1"), 9091), "error:"},
			{"excluded CIDR is not captured", "app", "tcp", ap(external4, 80), "peer"},
			{"other destinations are captured", "app", "tcp", ap(netip.MustParseAddr("10.77.0.9"), 443), "outbound 10.77.0.9:443"},
			{"IPv6 outbound is captured", "app", "tcp6", ap(peerV6, 80), "outbound [fd88::1]:80"},
		},
	},
}

// backends returns every backend under test (backendFactories), by name.
func backends(t *testing.T) map[string]capture.Backend {
	t.Helper()
	out := map[string]capture.Backend{}
	for name, mk := range backendFactories {
		b, err := mk(t)
		if err != nil {
			t.Fatalf("backend %s: %v", name, err)
		}
		out[name] = b
	}
	return out
}

// TestRealTrafficLandsWhereThePlanSays applies each case with each backend in a real
// namespace pair and sends real connections: they must land on the capture listener
// (with SO_ORIGINAL_DST equal to what the client dialled), or bypass it, exactly as
// Istio's capture does. After cleanup every flow reaches its original destination.
func TestRealTrafficLandsWhereThePlanSays(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	for bname, b := range backends(t) {
		for _, tc := range trafficCases {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				tp, err := sandbox.New(t.TempDir(), "")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tp.Close() })
				serveFlows(t, tp, tc.opts[redirect.FieldMode] == "TPROXY")
				plan := tc.opts.Plan(t)
				if _, err := capture.Apply(ctx, tp.Pod, b, plan); err != nil {
					t.Fatal(err)
				}
				sendFlows(t, tp, tc.flows)
				if _, err := capture.Cleanup(ctx, tp.Pod, b, plan); err != nil {
					t.Fatal(err)
				}
				for _, f := range tc.flows {
					if f.from != "app" || f.dst.Port() != 80 {
						continue
					}
					if got := send(t, tp, f); !strings.HasPrefix(got, "peer ") {
						t.Errorf("after cleanup: %s %s landed on %q, want the peer", f.proto, f.dst, got)
					}
				}
			})
		}
	}
}

// serveFlows starts the listeners trafficCases' flows land on, in tp's pod and
// peer; tproxy: the inbound port's is a TPROXY listener.
func serveFlows(t *testing.T, tp *sandbox.Topology, tproxy bool) {
	t.Helper()
	serve := func(ns, name, proto, addr string, transparent bool) {
		serveAs(t, ns, 0, name, proto, addr, transparent)
	}
	for _, proto := range []string{"tcp4", "tcp6"} {
		any := "0.0.0.0"
		if proto == "tcp6" {
			any = "[::]"
		}
		inbound := "inbound"
		if tproxy {
			inbound = "tproxy"
		}
		serve(tp.Pod, "outbound", proto, any+":15001", false)
		serve(tp.Pod, inbound, proto, any+":15006", tproxy)
		serve(tp.Pod, "tunnel", proto, any+":15008", false)
		serve(tp.Pod, "health", proto, any+":15021", false)
		serve(tp.Pod, "app", proto, any+":8080", false)
		serve(tp.Pod, "app9090", proto, any+":9090", false)
		serve(tp.Pod, "dnstcp", proto, any+":15053", false)
		serve(tp.Peer, "peer", proto, any+":80", false)
		serve(tp.Peer, "peer15020", proto, any+":15020", false)
	}
	// Like the Istio agent, the DNS listener binds localhost: REDIRECT sends local
	// traffic to 127.0.0.1, and the reply must come from there to match conntrack.
	serveAs(t, tp.Pod, proxyUID, "dns", "udp4", "127.0.0.1:15053", false)
	serve(tp.Peer, "peerdns", "udp4", "0.0.0.0:53", false)
}

// sendFlows sends each flow and fails t for each one that lands elsewhere than
// it wants.
func sendFlows(t *testing.T, tp *sandbox.Topology, flows []flow) {
	t.Helper()
	for _, f := range flows {
		got := send(t, tp, f)
		if !strings.HasPrefix(got, f.want) || (strings.Contains(f.want, " ") && got != f.want) {
			t.Errorf("%s: %s %s from %s landed on %q, want %q", f.name, f.proto, f.dst, f.from, got, f.want)
		}
	}
}

func send(t *testing.T, tp *sandbox.Topology, f flow) string {
	t.Helper()
	proto := strings.TrimSuffix(f.proto, "6")
	uid := uint32(appUID)
	switch f.from {
	case "peer":
		return sandbox.ProbeFrom(tp.Peer, proto, f.dst)
	case "proxy":
		uid = proxyUID
	}
	out, err := sandbox.ProbeAs(tp.Pod, selfCopy, uid, proto, f.dst, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func serveAs(t *testing.T, ns string, uid int, name, proto, addr string, transparent bool) {
	t.Helper()
	c, err := sandbox.Serve(ns, uid, name, proto, addr, transparent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
}
