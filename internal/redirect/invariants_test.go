package redirect_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/trace"
)

const randomSpecs = 2000

// randomSpec draws a valid spec that exercises every option. Its four listener ports
// are distinct: a spec that puts two listeners on one port is not a capture.
func randomSpec(r *rand.Rand) Spec {
	s := DefaultSpec()
	pick := func(n int) bool { return r.IntN(n) == 0 }
	port := func() uint16 {
		if pick(3) {
			return []uint16{53, 80, 443, 15001, 15006, 15008, 15020, 15053}[r.IntN(8)]
		}
		return uint16(1 + r.IntN(65535))
	}
	ports := func(max int) []uint16 {
		out := make([]uint16, r.IntN(max+1))
		for i := range out {
			out[i] = port()
		}
		return out
	}
	if pick(2) {
		var used []uint16
		for _, p := range []*uint16{&s.ProxyPort, &s.InboundCapturePort, &s.InboundTunnelPort, &s.DNSPort} {
			for {
				*p = port()
				if !slices.Contains(used, *p) {
					used = append(used, *p)
					break
				}
			}
		}
	}
	ids := func() []uint32 {
		out := make([]uint32, 1+r.IntN(3))
		for i := range out {
			out[i] = []uint32{0, 1, 2, 1337, 65534, r.Uint32N(InvalidID)}[r.IntN(6)]
		}
		return out
	}
	if pick(2) {
		s.ProxyUIDs = ids()
	}
	if pick(2) {
		s.ProxyGIDs = ids()
	}
	if pick(2) {
		s.Mode = ModeTProxy
		if pick(2) {
			s.TProxyMark = 1 + r.Uint32N(1<<31)
		}
		if pick(2) {
			s.TProxyRouteTable = []int{1, 252, 256, 1000}[r.IntN(4)]
		}
	}
	switch r.IntN(3) {
	case 0:
		s.InboundPorts = PortSet{All: true}
	case 1:
		s.InboundPorts = PortSet{Ports: ports(4)}
	}
	s.InboundPortsExclude = ports(3)
	s.OutboundCIDRs.All = pick(3)
	if !s.OutboundCIDRs.All {
		s.OutboundCIDRs.Prefixes = randomPrefixes(r, 3)
	}
	s.OutboundCIDRsExclude = randomPrefixes(r, 3)
	s.OutboundPorts = ports(3)
	s.OutboundPortsExclude = ports(3)
	ifaces := func() []string {
		var out []string
		for _, name := range []string{"eth1", "net1", "eth0", "tap0", "veth.1"} {
			if pick(4) {
				out = append(out, name)
			}
		}
		return out
	}
	s.ExcludeInterfaces = ifaces()
	s.RerouteVirtualInterfaces = ifaces()
	for _, g := range []string{"java", "202", "ftp", "888", "app_1", "0"} {
		if pick(4) {
			s.OwnerGroups.Groups = append(s.OwnerGroups.Groups, g)
		}
	}
	s.OwnerGroups.Except = pick(2)
	s.DNS.Enabled = pick(2)
	s.DNS.CaptureAll = pick(2)
	for range r.IntN(3) {
		s.DNS.Servers = append(s.DNS.Servers, randomAddr(r, pick(2)))
	}
	s.DropInvalid = pick(2)
	s.IPv6 = pick(2)
	if pick(3) {
		bits := 8 + r.IntN(25)
		s.HostIPv4Loopback = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, byte(r.IntN(256)), byte(r.IntN(256)), byte(1 + r.IntN(255))}), bits)
	}
	return s
}

func randomAddr(r *rand.Rand, v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		b[0] = 0xfd
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{byte(1 + r.IntN(223)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
}

func randomPrefixes(r *rand.Rand, max int) []netip.Prefix {
	out := make([]netip.Prefix, r.IntN(max+1))
	for i := range out {
		v6 := r.IntN(2) == 0
		a := randomAddr(r, v6)
		bits := r.IntN(a.BitLen() + 1)
		out[i] = netip.PrefixFrom(a, bits).Masked()
	}
	return out
}

// randomPacket draws a packet that the spec's plan might see.
func randomPacket(r *rand.Rand, s Spec) trace.Packet {
	v6 := s.IPv6 && r.IntN(2) == 0 || r.IntN(10) == 0
	addr := func() netip.Addr {
		switch r.IntN(6) {
		case 0:
			if v6 {
				return trace.Pod6
			}
			return trace.Pod4
		case 1:
			if v6 {
				return netip.MustParseAddr("::1")
			}
			return netip.MustParseAddr("127.0.0.1")
		case 2:
			if v6 {
				return InboundPassthroughV6.Addr()
			}
			return InboundPassthroughV4.Addr()
		case 3:
			if len(s.DNS.Servers) > 0 {
				if a := s.DNS.Servers[r.IntN(len(s.DNS.Servers))]; a.Is6() == v6 {
					return a
				}
			}
		}
		return randomAddr(r, v6)
	}
	ifaces := append([]string{"eth0", "lo", "ext0"}, append(s.ExcludeInterfaces, s.RerouteVirtualInterfaces...)...)
	port := func() uint16 {
		interesting := []uint16{53, 80, s.ProxyPort, s.InboundCapturePort, s.InboundTunnelPort, s.DNSPort}
		interesting = append(interesting, s.InboundPorts.Ports...)
		interesting = append(interesting, s.OutboundPorts...)
		interesting = append(interesting, s.OutboundPortsExclude...)
		if r.IntN(4) == 0 {
			return uint16(r.IntN(65536))
		}
		return interesting[r.IntN(len(interesting))]
	}
	ids := append([]uint32{0, 1000, 2001}, append(s.ProxyUIDs, s.ProxyGIDs...)...)
	p := trace.Packet{
		Src: addr(), Dst: addr(),
		Proto:   []Protocol{TCP, TCP, UDP, "icmp"}[r.IntN(4)],
		SrcPort: port(), DstPort: port(),
		Mark:     []uint32{0, s.TProxyMark, OutboundMark}[r.IntN(3)],
		ConnMark: []uint32{0, s.TProxyMark}[r.IntN(2)],
		CTState:  []CTState{"", trace.CTNew, CTEstablished, CTRelated, CTInvalid}[r.IntN(5)],
	}
	if r.IntN(2) == 0 {
		p.Direction, p.InIface = trace.Inbound, ifaces[r.IntN(len(ifaces))]
	} else {
		p.Direction, p.OutIface = trace.Outbound, ifaces[r.IntN(len(ifaces))]
		p.UID, p.GID = ids[r.IntN(len(ids))], ids[r.IntN(len(ids))]
		p.GroupName = []string{"", "java", "ftp", "app_1"}[r.IntN(4)]
		p.NoSocket = r.IntN(20) == 0
	}
	return p
}

// eachRandomPlan draws randomSpecs specs from a generator seeded with seed, checks
// each is valid and builds, and calls fn with the spec, its plan and the generator
// (to draw packets from).
func eachRandomPlan(t *testing.T, seed uint64, fn func(i int, r *rand.Rand, s Spec, p *Plan)) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range randomSpecs {
		s := randomSpec(r)
		if err := s.Validate(); err != nil {
			t.Fatalf("spec %d: the generator made an invalid spec: %v\n%+v", i, err, s)
		}
		p, err := Build(s)
		if err != nil {
			t.Fatalf("spec %d: Build: %v\n%+v", i, err, s)
		}
		fn(i, r, s, p)
	}
}

// TestRandomSpecsBuildValidPlans: every valid spec builds, and its plan holds the
// invariants.
func TestRandomSpecsBuildValidPlans(t *testing.T) {
	eachRandomPlan(t, 1, func(i int, _ *rand.Rand, s Spec, p *Plan) {
		if err := p.Check(); err != nil {
			t.Fatalf("spec %d: Check: %v\n%+v", i, err, s)
		}
	})
}

// TestRandomSpecsRouteOnlyTProxyCapturedInbound: a plan has TPROXY's policy
// routing exactly when it TPROXY-captures inbound traffic (TPROXY mode and inbound
// ports), as Istio's configureTProxyRoutes; a plan with a TPROXY rule always has it.
func TestRandomSpecsRouteOnlyTProxyCapturedInbound(t *testing.T) {
	eachRandomPlan(t, 1, func(i int, _ *rand.Rand, s Spec, p *Plan) {
		want := s.Mode == ModeTProxy && !s.InboundPorts.Empty()
		if got := p.Routing != nil; got != want {
			t.Fatalf("spec %d: routing %v, want %v (mode %s, inbound ports %+v)", i, got, want, s.Mode, s.InboundPorts)
		}
		if hasTarget(p, TargetTProxy) && p.Routing == nil {
			t.Fatalf("spec %d: a TPROXY rule without policy routing\n%+v", i, s)
		}
		if p.Routing != nil && (p.Routing.Mark != s.TProxyMark || p.Routing.Table != s.TProxyRouteTable) {
			t.Fatalf("spec %d: routing %+v, want mark %d table %d", i, *p.Routing, s.TProxyMark, s.TProxyRouteTable)
		}
	})
}

func hasTarget(p *Plan, kind TargetKind) bool {
	for _, fp := range p.Families {
		for _, tp := range fp.Tables {
			for _, r := range tp.Rules {
				if r.Target.Kind == kind {
					return true
				}
			}
		}
	}
	return false
}

// TestRandomSpecsTraceWithoutError: the tracer understands every plan the builder
// makes, for any packet.
func TestRandomSpecsTraceWithoutError(t *testing.T) {
	eachRandomPlan(t, 3, func(i int, r *rand.Rand, s Spec, p *Plan) {
		for range 20 {
			pkt := randomPacket(r, s)
			if _, err := trace.Trace(p, pkt); err != nil {
				t.Fatalf("spec %d: %v\n%+v", i, err, s)
			}
		}
	})
}

// TestRandomSpecsProxyTrafficNeverLoops: whatever the spec, a packet the proxy sends
// (by uid or by gid) to a non-loopback address never comes back to the proxy's own
// outbound listener.
func TestRandomSpecsProxyTrafficNeverLoops(t *testing.T) {
	checked := 0
	defer func() {
		if checked < randomSpecs*10 {
			t.Errorf("only %d proxy packets checked", checked)
		}
	}()
	eachRandomPlan(t, 5, func(i int, r *rand.Rand, s Spec, p *Plan) {
		for range 20 {
			pkt := randomPacket(r, s)
			pkt.Direction, pkt.InIface = trace.Outbound, ""
			if pkt.OutIface == "" {
				pkt.OutIface = "eth0"
			}
			pkt.NoSocket = false
			pkt.Proto = []Protocol{TCP, UDP}[r.IntN(2)]
			if r.IntN(2) == 0 {
				pkt.UID = s.ProxyUIDs[r.IntN(len(s.ProxyUIDs))]
			} else {
				pkt.GID = s.ProxyGIDs[r.IntN(len(s.ProxyGIDs))]
			}
			if pkt.Dst.IsLoopback() || s.HostIPv4Loopback.Contains(pkt.Dst) {
				continue
			}
			v, err := trace.Trace(p, pkt)
			if err != nil {
				t.Fatalf("spec %d: %v", i, err)
			}
			checked++
			if v.Action == trace.Redirected && v.Port == s.ProxyPort {
				t.Fatalf("spec %d: proxy packet %s loops back to the proxy port %d\n%s\nspec %+v", i, pkt, s.ProxyPort, v, s)
			}
		}
	})
}

// TestRandomSpecsTunnelPortIsNotCaptured: inbound traffic to the tunnel port is never
// captured in REDIRECT mode. In TPROXY mode Istio's mangle rules have no tunnel-port
// exception, so the port is captured exactly when the inbound ports select it; this
// pins that behaviour.
func TestRandomSpecsTunnelPortIsNotCaptured(t *testing.T) {
	eachRandomPlan(t, 7, func(i int, r *rand.Rand, s Spec, p *Plan) {
		for _, v6 := range []bool{false, true} {
			if v6 && !s.IPv6 {
				continue
			}
			dst := trace.Pod4
			if v6 {
				dst = trace.Pod6
			}
			pkt := trace.Packet{Direction: trace.Inbound, Src: randomAddr(r, v6), Dst: dst, Proto: TCP,
				SrcPort: 50000, DstPort: s.InboundTunnelPort, InIface: "ext0"}
			v, err := trace.Trace(p, pkt)
			if err != nil {
				t.Fatalf("spec %d: %v", i, err)
			}
			selected := s.InboundPorts.All && !slices.Contains(s.InboundPortsExclude, s.InboundTunnelPort) ||
				slices.Contains(s.InboundPorts.Ports, s.InboundTunnelPort)
			want := trace.Passed
			if s.Mode == ModeTProxy && selected {
				want = trace.TProxied
			}
			if v.Action != want {
				t.Fatalf("spec %d (%s, inbound ports %+v exclude %v): %s is %s, want %s\n%s",
					i, s.Mode, s.InboundPorts, s.InboundPortsExclude, pkt, v.Action, want, v)
			}
		}
	})
}

// TestRandomSpecsAreDeterministic: building the same spec twice gives the same plan.
func TestRandomSpecsAreDeterministic(t *testing.T) {
	eachRandomPlan(t, 9, func(i int, _ *rand.Rand, s Spec, a *Plan) {
		b, err := Build(s)
		if err != nil {
			t.Fatalf("spec %d: %v", i, err)
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if !bytes.Equal(ja, jb) {
			t.Fatalf("spec %d: two builds differ:\n%s\n%s", i, ja, jb)
		}
	})
}
