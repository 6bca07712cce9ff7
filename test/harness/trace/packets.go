package trace

import (
	"net/netip"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Pod4 and Pod6 are the addresses of the pod that Out and In packets belong to.
var (
	Pod4 = netip.MustParseAddr("10.0.0.9")
	Pod6 = netip.MustParseAddr("fd00::9")
)

// AppUID is the application's uid in test packets, ProxyUID the sidecar's.
const (
	AppUID   = 1000
	ProxyUID = redirect.DefaultProxyUID
)

// PacketOption changes a packet that Out or In builds.
type PacketOption func(*Packet)

// Out is a TCP connection's first packet sent by uid (gid = uid) to dst:dport. It
// leaves through lo when dst is local (loopback or the pod's own address), else eth0.
func Out(uid uint32, dst string, dport uint16, opts ...PacketOption) Packet {
	d := netip.MustParseAddr(dst)
	p := Packet{Direction: Outbound, Dst: d, Proto: redirect.TCP, SrcPort: 40000, DstPort: dport, UID: uid, GID: uid, OutIface: "eth0"}
	switch {
	case d.Is4() && d.IsLoopback():
		p.Src, p.OutIface = netip.MustParseAddr("127.0.0.1"), "lo"
	case d.IsLoopback():
		p.Src, p.OutIface = d, "lo"
	case d.Is4():
		p.Src = Pod4
	default:
		p.Src = Pod6
	}
	if d == Pod4 || d == Pod6 {
		p.OutIface = "lo"
	}
	return apply(p, opts)
}

// In is a TCP connection's first packet from src arriving on eth0 for the pod's port.
func In(src string, dport uint16, opts ...PacketOption) Packet {
	s := netip.MustParseAddr(src)
	p := Packet{Direction: Inbound, Src: s, Dst: Pod4, Proto: redirect.TCP, SrcPort: 50000, DstPort: dport, InIface: "eth0"}
	if s.Is6() {
		p.Dst = Pod6
	}
	return apply(p, opts)
}

func apply(p Packet, opts []PacketOption) Packet {
	for _, o := range opts {
		o(&p)
	}
	return p
}

// WithUDP makes the packet UDP.
func WithUDP(p *Packet) { p.Proto = redirect.UDP }

// WithIface sets the interface the packet leaves through (outbound) or arrives on
// (inbound).
func WithIface(name string) PacketOption {
	return func(p *Packet) {
		if p.Direction == Outbound {
			p.OutIface = name
		} else {
			p.InIface = name
		}
	}
}

func WithSrc(a string) PacketOption             { return func(p *Packet) { p.Src = netip.MustParseAddr(a) } }
func WithDst(a string) PacketOption             { return func(p *Packet) { p.Dst = netip.MustParseAddr(a) } }
func WithSport(port uint16) PacketOption        { return func(p *Packet) { p.SrcPort = port } }
func WithState(s redirect.CTState) PacketOption { return func(p *Packet) { p.CTState = s } }
func WithMark(m uint32) PacketOption            { return func(p *Packet) { p.Mark = m } }
func WithConnMark(m uint32) PacketOption        { return func(p *Packet) { p.ConnMark = m } }
func WithGroups(gs ...string) PacketOption      { return func(p *Packet) { p.Groups = gs } }

// WithGroup sets the sending socket's gid and that group's name ("" for none).
func WithGroup(gid uint32, name string) PacketOption {
	return func(p *Packet) { p.GID, p.GroupName = gid, name }
}

// Expected verdicts, refined with InZone, Marked and ConnMarked. Compare them with
// IgnoreTrace, as they list no steps.
func Pass() Verdict                  { return Verdict{Action: Passed} }
func RedirectTo(port uint16) Verdict { return Verdict{Action: Redirected, Port: port} }
func TProxyTo(port uint16, mark uint32) Verdict {
	return Verdict{Action: TProxied, Port: port, Mark: mark}
}
func Drop() Verdict                           { return Verdict{Action: Dropped} }
func (v Verdict) InZone(z uint16) Verdict     { v.Zone = z; return v }
func (v Verdict) Marked(m uint32) Verdict     { v.Mark = m; return v }
func (v Verdict) ConnMarked(m uint32) Verdict { v.ConnMark = m; return v }

// IgnoreTrace compares verdicts by where the packet lands, not by the rules it hit.
var IgnoreTrace cmp.Option = cmpopts.IgnoreFields(Verdict{}, "Trace")
