package nftables

import (
	"bytes"
	"fmt"
	"math/bits"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// decodeRule reads a rule's expressions, as the kernel holds them, back into the
// typed rule ruleExprs encodes, so that live and planned rules are compared by
// content rather than by how a tool prints them. It accepts the expressions
// ruleExprs writes (which are those nft 1.0.6 writes for the rendered text) and
// nothing else: ok is false for any other rule, which then never equals a planned
// one. Counters are skipped: they count packets and decide nothing.
//
// exprs holds *expr.X values and opaqueExpr for expressions without a decoder;
// sets holds the anonymous sets of the rule's table by name.
func decodeRule(f redirect.Family, exprs []any, sets map[string]liveSet) (r rule, ok bool, text string) {
	d := decoder{f: f, sets: sets}
	for _, e := range exprs {
		if _, isCounter := e.(*expr.Counter); !isCounter {
			d.ex = append(d.ex, e)
		}
	}
	for d.i < len(d.ex) {
		if t, ok := d.target(); ok {
			r.target = t
			return r, true, r.text(f)
		}
		m, ok := d.match()
		if !ok {
			break
		}
		r.matches = append(r.matches, m)
	}
	// Not a rule of ours: what decoded in nft's words, then the rest expression by
	// expression, so a person can still see what the rule does.
	var parts []string
	for i := range r.matches {
		parts = append(parts, r.matches[i].text(f))
	}
	for _, e := range d.ex[d.i:] {
		parts = append(parts, exprText(e))
	}
	if len(d.ex) == 0 {
		parts = append(parts, "(no expressions)")
	}
	return rule{}, false, strings.Join(parts, " ")
}

// liveSet is a set of a live table, as far as a lookup in our rules may use it.
type liveSet struct {
	anonymous, constant, interval, isMap bool
	keys                                 [][]byte
}

// opaqueExpr is an expression this package has no decoder for.
type opaqueExpr struct{ name string }

type decoder struct {
	f    redirect.Family
	ex   []any
	i    int
	sets map[string]liveSet
	// proto is the transport protocol an earlier port match of the rule checked:
	// a later port match of the same protocol comes without its own check.
	proto redirect.Protocol
}

func (d *decoder) at(k int) any {
	if d.i+k < len(d.ex) {
		return d.ex[d.i+k]
	}
	return nil
}

// cmpAt returns the comparison at offset k if it reads register reg and compares
// n bytes, with the negation its operator means.
func (d *decoder) cmpAt(k int, reg uint32, n int) (data []byte, negate, ok bool) {
	c, isCmp := d.at(k).(*expr.Cmp)
	if !isCmp || c.Register != reg || len(c.Data) != n {
		return nil, false, false
	}
	switch c.Op {
	case expr.CmpOpEq:
		return c.Data, false, true
	case expr.CmpOpNeq:
		return c.Data, true, true
	}
	return nil, false, false
}

// lookupAt returns the keys of the anonymous constant set a lookup at offset k
// tests register reg against.
func (d *decoder) lookupAt(k int, reg uint32, keyLen int) (keys [][]byte, invert, ok bool) {
	l, isLookup := d.at(k).(*expr.Lookup)
	if !isLookup || l.SourceRegister != reg || l.IsDestRegSet {
		return nil, false, false
	}
	s, found := d.sets[l.SetName]
	if !found || !s.anonymous || !s.constant || s.interval || s.isMap || len(s.keys) == 0 {
		return nil, false, false
	}
	for _, k := range s.keys {
		if len(k) != keyLen {
			return nil, false, false
		}
	}
	return s.keys, l.Invert, true
}

func load(e any) (key expr.MetaKey, reg uint32, ok bool) {
	m, isMeta := e.(*expr.Meta)
	if !isMeta || m.SourceRegister {
		return 0, 0, false
	}
	return m.Key, m.Register, true
}

func metaSet(e any, key expr.MetaKey, reg uint32) bool {
	m, isMeta := e.(*expr.Meta)
	return isMeta && m.SourceRegister && m.Key == key && m.Register == reg
}

func ctLoad(e any) (key expr.CtKey, reg uint32, ok bool) {
	c, isCt := e.(*expr.Ct)
	if !isCt || c.SourceRegister || c.Direction != 0 {
		return 0, 0, false
	}
	return c.Key, c.Register, true
}

func ctSet(e any, key expr.CtKey, reg uint32) bool {
	c, isCt := e.(*expr.Ct)
	return isCt && c.SourceRegister && c.Key == key && c.Register == reg && c.Direction == 0
}

func immediate(e any, n int) (data []byte, reg uint32, ok bool) {
	im, isImm := e.(*expr.Immediate)
	if !isImm || im.Register == unix.NFT_REG_VERDICT || len(im.Data) != n {
		return nil, 0, false
	}
	return im.Data, im.Register, true
}

func isVerdict(e any, kind expr.VerdictKind) bool {
	v, ok := e.(*expr.Verdict)
	return ok && v.Kind == kind
}

func protocolOf(b byte) (redirect.Protocol, bool) {
	switch b {
	case unix.IPPROTO_TCP:
		return redirect.TCP, true
	case unix.IPPROTO_UDP:
		return redirect.UDP, true
	}
	return "", false
}

// match decodes the match at the cursor and moves past it.
func (d *decoder) match() (match, bool) {
	m, n := d.matchHere()
	if n == 0 {
		return match{}, false
	}
	d.i += n
	if m.kind == redirect.MatchDestPort || m.kind == redirect.MatchSourcePort {
		d.proto = m.proto
	}
	return m, true
}

// matchHere decodes the match at the cursor and says how many expressions it took
// (0: none decodes).
func (d *decoder) matchHere() (match, int) {
	if p, isPayload := d.at(0).(*expr.Payload); isPayload {
		if p.Base == expr.PayloadBaseTransportHeader && d.proto != "" {
			return d.ports(d.proto, 0)
		}
		return d.address(p)
	}
	if key, reg, ok := ctLoad(d.at(0)); ok {
		switch key {
		case expr.CtKeyMARK:
			data, neg, ok := d.cmpAt(1, reg, 4)
			if !ok {
				return match{}, 0
			}
			return match{kind: redirect.MatchConnMark, negate: neg, mark: binaryutil.NativeEndian.Uint32(data)}, 2
		case expr.CtKeySTATE:
			return d.ctState(reg)
		}
		return match{}, 0
	}
	key, reg, ok := load(d.at(0))
	if !ok {
		return match{}, 0
	}
	switch key {
	case expr.MetaKeyL4PROTO:
		data, neg, ok := d.cmpAt(1, reg, 1)
		if !ok {
			return match{}, 0
		}
		proto, ok := protocolOf(data[0])
		if !ok {
			return match{}, 0
		}
		if p, isPayload := d.at(2).(*expr.Payload); isPayload && p.Base == expr.PayloadBaseTransportHeader {
			// The protocol a port match depends on.
			if neg {
				return match{}, 0
			}
			return d.ports(proto, 2)
		}
		return match{kind: redirect.MatchProtocol, negate: neg, proto: proto}, 2
	case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
		data, neg, ok := d.cmpAt(1, reg, unix.IFNAMSIZ)
		if !ok {
			return match{}, 0
		}
		// A full IFNAMSIZ comparison, NUL padded: an exact name, not a wildcard.
		name, pad, _ := bytes.Cut(data, []byte{0})
		if len(name) == 0 || len(bytes.Trim(pad, "\x00")) != 0 || len(name) == unix.IFNAMSIZ {
			return match{}, 0
		}
		kind := redirect.MatchInIface
		if key == expr.MetaKeyOIFNAME {
			kind = redirect.MatchOutIface
		}
		return match{kind: kind, negate: neg, iface: string(name)}, 2
	case expr.MetaKeySKUID, expr.MetaKeySKGID, expr.MetaKeyMARK:
		data, neg, ok := d.cmpAt(1, reg, 4)
		if !ok {
			return match{}, 0
		}
		v := binaryutil.NativeEndian.Uint32(data)
		switch key {
		case expr.MetaKeySKUID:
			return match{kind: redirect.MatchUIDOwner, negate: neg, id: v}, 2
		case expr.MetaKeySKGID:
			return match{kind: redirect.MatchGIDOwner, negate: neg, id: v}, 2
		}
		return match{kind: redirect.MatchMark, negate: neg, mark: v}, 2
	}
	return match{}, 0
}

// ports decodes a port match: the transport header load at offset k (after the
// protocol check when there is one), then a comparison or a set lookup.
func (d *decoder) ports(proto redirect.Protocol, k int) (match, int) {
	p := d.at(k).(*expr.Payload)
	if p.Base != expr.PayloadBaseTransportHeader || p.OperationType != expr.PayloadLoad || p.Len != 2 || (p.Offset != 0 && p.Offset != 2) {
		return match{}, 0
	}
	m := match{kind: redirect.MatchDestPort, proto: proto}
	if p.Offset == 0 {
		m.kind = redirect.MatchSourcePort
	}
	if data, neg, ok := d.cmpAt(k+1, p.DestRegister, 2); ok {
		m.negate = neg
		m.ports = []uint16{binaryutil.BigEndian.Uint16(data)}
		return m, k + 2
	}
	keys, inv, ok := d.lookupAt(k+1, p.DestRegister, 2)
	if !ok {
		return match{}, 0
	}
	for _, k := range keys {
		m.ports = append(m.ports, binaryutil.BigEndian.Uint16(k))
	}
	m.ports = slices.Compact(slices.Sorted(slices.Values(m.ports)))
	m.negate = inv
	return m, k + 2
}

// address decodes a source or destination prefix: a load of the whole address,
// masked unless the prefix is a host, or of its leading bytes when the prefix
// length is a whole number of bytes.
func (d *decoder) address(p *expr.Payload) (match, int) {
	addrLen, saddrOff, daddrOff := addrLayout(d.f)
	if p.OperationType != expr.PayloadLoad || p.Base != expr.PayloadBaseNetworkHeader || p.Len == 0 || p.Len > addrLen {
		return match{}, 0
	}
	m := match{kind: redirect.MatchDest}
	switch p.Offset {
	case saddrOff:
		m.kind = redirect.MatchSource
	case daddrOff:
	default:
		return match{}, 0
	}
	prefixLen, n := int(p.Len)*8, 2
	if b, isBitwise := d.at(1).(*expr.Bitwise); isBitwise && p.Len == addrLen {
		if b.SourceRegister != p.DestRegister || b.DestRegister != p.DestRegister || b.Len != addrLen ||
			len(b.Mask) != int(addrLen) || !bytes.Equal(b.Xor, make([]byte, addrLen)) {
			return match{}, 0
		}
		ones, ok := leadingOnes(b.Mask)
		if !ok {
			return match{}, 0
		}
		prefixLen, n = ones, 3
	}
	data, neg, ok := d.cmpAt(n-1, p.DestRegister, int(p.Len))
	if !ok {
		return match{}, 0
	}
	full := make([]byte, addrLen)
	copy(full, data)
	addr, _ := netip.AddrFromSlice(full)
	m.negate = neg
	m.prefix = netip.PrefixFrom(addr, prefixLen)
	return m, n
}

// leadingOnes counts a netmask's bits, and is false for a mask that is not one.
func leadingOnes(mask []byte) (int, bool) {
	n := 0
	for i, b := range mask {
		ones := bits.LeadingZeros8(^b)
		n += ones
		if ones < 8 {
			if b<<ones != 0 || len(bytes.Trim(mask[i+1:], "\x00")) != 0 {
				return 0, false
			}
			break
		}
	}
	return n, true
}

// ctState decodes the three forms of a conntrack state match ruleExprs writes.
func (d *decoder) ctState(reg uint32) (match, int) {
	m := match{kind: redirect.MatchCTState}
	known := uint32(ctStateInvalid | ctStateEstablished | ctStateRelated)
	if b, isBitwise := d.at(1).(*expr.Bitwise); isBitwise {
		// Any of the states: the state bit is in the mask.
		if b.SourceRegister != reg || b.DestRegister != reg || b.Len != 4 || len(b.Mask) != 4 || !bytes.Equal(b.Xor, make([]byte, 4)) {
			return match{}, 0
		}
		data, neg, ok := d.cmpAt(2, reg, 4)
		if !ok || !neg || !bytes.Equal(data, make([]byte, 4)) {
			return match{}, 0
		}
		m.states = binaryutil.NativeEndian.Uint32(b.Mask)
		if m.states == 0 || m.states&^known != 0 {
			return match{}, 0
		}
		return m, 3
	}
	if data, neg, ok := d.cmpAt(1, reg, 4); ok {
		// Not this one state.
		m.states = binaryutil.NativeEndian.Uint32(data)
		if !neg || bits.OnesCount32(m.states) != 1 || m.states&^known != 0 {
			return match{}, 0
		}
		m.negate = true
		return m, 2
	}
	keys, inv, ok := d.lookupAt(1, reg, 4)
	if !ok || !inv {
		return match{}, 0
	}
	for _, k := range keys {
		s := binaryutil.NativeEndian.Uint32(k)
		if bits.OnesCount32(s) != 1 || s&^known != 0 {
			return match{}, 0
		}
		m.states |= s
	}
	m.negate = true
	return m, 2
}

// target decodes the statements that end a rule; they must be the rest of it.
func (d *decoder) target() (redirect.Target, bool) {
	e := d.ex[d.i:]
	var t redirect.Target
	switch len(e) {
	case 1:
		v, ok := e[0].(*expr.Verdict)
		if !ok {
			return t, false
		}
		switch v.Kind {
		case expr.VerdictJump:
			t = redirect.Target{Kind: redirect.TargetJump, Chain: v.Chain}
		case expr.VerdictReturn:
			t.Kind = redirect.TargetReturn
		case expr.VerdictAccept:
			t.Kind = redirect.TargetAccept
		case expr.VerdictDrop:
			t.Kind = redirect.TargetDrop
		default:
			return t, false
		}
	case 2:
		var ok bool
		t, ok = targetPair(e[0], e[1])
		if !ok {
			return t, false
		}
	case 5:
		// tproxy to :port, then meta mark set, then accept.
		port, reg, ok := immediate(e[0], 2)
		tp, isTProxy := e[1].(*expr.TProxy)
		if !ok || !isTProxy || tp.Family != nfproto(d.f) || tp.RegPort != reg || tp.RegAddr != 0 {
			return t, false
		}
		mark, markReg, ok := immediate(e[2], 4)
		if !ok || !metaSet(e[3], expr.MetaKeyMARK, markReg) || !isVerdict(e[4], expr.VerdictAccept) {
			return t, false
		}
		t = redirect.Target{Kind: redirect.TargetTProxy, Port: binaryutil.BigEndian.Uint16(port), Mark: binaryutil.NativeEndian.Uint32(mark)}
	default:
		return t, false
	}
	d.i = len(d.ex)
	return t, true
}

// targetPair decodes the targets written as a value and what uses it.
func targetPair(a, b any) (redirect.Target, bool) {
	if port, reg, ok := immediate(a, 2); ok {
		if r, isRedir := b.(*expr.Redir); isRedir {
			if r.RegisterProtoMin != reg || (r.RegisterProtoMax != 0 && r.RegisterProtoMax != reg) || r.Flags != unix.NF_NAT_RANGE_PROTO_SPECIFIED {
				return redirect.Target{}, false
			}
			return redirect.Target{Kind: redirect.TargetRedirect, Port: binaryutil.BigEndian.Uint16(port)}, true
		}
		if ctSet(b, expr.CtKeyZONE, reg) {
			return redirect.Target{Kind: redirect.TargetCTZone, Zone: binaryutil.NativeEndian.Uint16(port)}, true
		}
		return redirect.Target{}, false
	}
	if mark, reg, ok := immediate(a, 4); ok && metaSet(b, expr.MetaKeyMARK, reg) {
		return redirect.Target{Kind: redirect.TargetSetMark, Mark: binaryutil.NativeEndian.Uint32(mark)}, true
	}
	if key, reg, ok := load(a); ok && key == expr.MetaKeyMARK && ctSet(b, expr.CtKeyMARK, reg) {
		return redirect.Target{Kind: redirect.TargetSaveMark}, true
	}
	if key, reg, ok := ctLoad(a); ok && key == expr.CtKeyMARK && metaSet(b, expr.MetaKeyMARK, reg) {
		return redirect.Target{Kind: redirect.TargetRestoreMark}, true
	}
	return redirect.Target{}, false
}

// exprText shows an expression that did not decode, for a person reading a
// difference: its kind and fields, byte strings in hex.
func exprText(e any) string {
	switch x := e.(type) {
	case opaqueExpr:
		return "[" + x.name + "]"
	case *expr.Verdict:
		if t, ok := (&decoder{ex: []any{x}}).target(); ok {
			return "[" + targetText(t) + "]"
		}
	}
	v := reflect.Indirect(reflect.ValueOf(e))
	var fields []string
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.IsZero() {
			continue
		}
		if b, ok := f.Interface().([]byte); ok {
			fields = append(fields, fmt.Sprintf("%s=0x%x", v.Type().Field(i).Name, b))
			continue
		}
		fields = append(fields, fmt.Sprintf("%s=%v", v.Type().Field(i).Name, f.Interface()))
	}
	return "[" + strings.ToLower(v.Type().Name()) + " " + strings.Join(fields, " ") + "]"
}
