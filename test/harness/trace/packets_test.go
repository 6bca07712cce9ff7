package trace

import (
	"fmt"
	"net/netip"

	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// The pod the packets belong to.
var (
	pod4 = netip.MustParseAddr("10.0.0.9")
	pod6 = netip.MustParseAddr("fd00::9")
)

const (
	appUID   = 1000
	proxyUID = redirect.DefaultProxyUID
)

type pktMod func(*Packet)

// out is a TCP connection's first packet sent by uid (gid = uid) to dst:dport. It
// leaves through lo when dst is local (loopback or the pod's own address), else eth0.
func out(uid uint32, dst string, dport uint16, mods ...pktMod) Packet {
	d := netip.MustParseAddr(dst)
	p := Packet{Direction: Outbound, Dst: d, Proto: redirect.TCP, SrcPort: 40000, DstPort: dport, UID: uid, GID: uid, OutIface: "eth0"}
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
func in(src string, dport uint16, mods ...pktMod) Packet {
	s := netip.MustParseAddr(src)
	p := Packet{Direction: Inbound, Src: s, Dst: pod4, Proto: redirect.TCP, SrcPort: 50000, DstPort: dport, InIface: "eth0"}
	if s.Is6() {
		p.Dst = pod6
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

func withUDP(p *Packet) { p.Proto = redirect.UDP }
func withIface(name string) pktMod {
	return func(p *Packet) {
		if p.Direction == Outbound {
			p.OutIface = name
		} else {
			p.InIface = name
		}
	}
}
func withSrc(a string) pktMod             { return func(p *Packet) { p.Src = netip.MustParseAddr(a) } }
func withState(s redirect.CTState) pktMod { return func(p *Packet) { p.CTState = s } }
func withMark(m uint32) pktMod            { return func(p *Packet) { p.Mark = m } }
func withConnMark(m uint32) pktMod        { return func(p *Packet) { p.ConnMark = m } }
func withGroups(gs ...string) pktMod      { return func(p *Packet) { p.Groups = gs } }
func withGroup(gid uint32, name string) pktMod {
	return func(p *Packet) { p.GID, p.GroupName = gid, name }
}

func passed() Verdict                { return Verdict{Action: Passed} }
func redirected(port uint16) Verdict { return Verdict{Action: Redirected, Port: port} }
func tproxied(port uint16, m uint32) Verdict {
	return Verdict{Action: TProxied, Port: port, Mark: m}
}
func dropped() Verdict                        { return Verdict{Action: Dropped} }
func (v Verdict) zone(z uint16) Verdict       { v.Zone = z; return v }
func (v Verdict) marked(m uint32) Verdict     { v.Mark = m; return v }
func (v Verdict) connMarked(m uint32) Verdict { v.ConnMark = m; return v }

var ignoreTrace = cmpopts.IgnoreFields(Verdict{}, "Trace")

// Matches and targets for hand-built plans.
func proto(p redirect.Protocol) redirect.Match {
	return redirect.Match{Kind: redirect.MatchProtocol, Proto: p}
}
func inIface(name string) redirect.Match {
	return redirect.Match{Kind: redirect.MatchInIface, Iface: name}
}
func outIface(name string) redirect.Match {
	return redirect.Match{Kind: redirect.MatchOutIface, Iface: name}
}
func src(p netip.Prefix) redirect.Match { return redirect.Match{Kind: redirect.MatchSource, Prefix: p} }
func dst(p netip.Prefix) redirect.Match { return redirect.Match{Kind: redirect.MatchDest, Prefix: p} }
func notDst(p netip.Prefix) redirect.Match {
	return redirect.Match{Kind: redirect.MatchDest, Prefix: p, Negate: true}
}
func dport(ports ...uint16) redirect.Match {
	return redirect.Match{Kind: redirect.MatchDestPort, Ports: ports}
}
func notDport(ports ...uint16) redirect.Match {
	return redirect.Match{Kind: redirect.MatchDestPort, Ports: ports, Negate: true}
}
func sport(port uint16) redirect.Match {
	return redirect.Match{Kind: redirect.MatchSourcePort, Ports: []uint16{port}}
}
func uidOwner(id uint32) redirect.Match {
	return redirect.Match{Kind: redirect.MatchUIDOwner, Owner: fmt.Sprint(id)}
}
func notUIDOwner(id uint32) redirect.Match {
	return redirect.Match{Kind: redirect.MatchUIDOwner, Owner: fmt.Sprint(id), Negate: true}
}
func gidOwner(g string) redirect.Match { return redirect.Match{Kind: redirect.MatchGIDOwner, Owner: g} }
func notGIDOwner(g string) redirect.Match {
	return redirect.Match{Kind: redirect.MatchGIDOwner, Owner: g, Negate: true}
}
func mark(m uint32) redirect.Match { return redirect.Match{Kind: redirect.MatchMark, Mark: m} }
func notMark(m uint32) redirect.Match {
	return redirect.Match{Kind: redirect.MatchMark, Mark: m, Negate: true}
}
func connMark(m uint32) redirect.Match { return redirect.Match{Kind: redirect.MatchConnMark, Mark: m} }
func ctState(s ...redirect.CTState) redirect.Match {
	return redirect.Match{Kind: redirect.MatchCTState, CTStates: s}
}

func jump(chain string) redirect.Target {
	return redirect.Target{Kind: redirect.TargetJump, Chain: chain}
}
func redirectTo(port uint16) redirect.Target {
	return redirect.Target{Kind: redirect.TargetRedirect, Port: port}
}
func setMark(m uint32) redirect.Target { return redirect.Target{Kind: redirect.TargetSetMark, Mark: m} }
func ctZone(z uint16) redirect.Target  { return redirect.Target{Kind: redirect.TargetCTZone, Zone: z} }
func tproxy(port uint16, m uint32) redirect.Target {
	return redirect.Target{Kind: redirect.TargetTProxy, Port: port, Mark: m}
}

var (
	ret         = redirect.Target{Kind: redirect.TargetReturn}
	accept      = redirect.Target{Kind: redirect.TargetAccept}
	drop        = redirect.Target{Kind: redirect.TargetDrop}
	saveMark    = redirect.Target{Kind: redirect.TargetSaveMark}
	restoreMark = redirect.Target{Kind: redirect.TargetRestoreMark}
)
