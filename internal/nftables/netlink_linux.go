package nftables

import (
	"fmt"
	"slices"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// flushRuleset programs the ruleset through netlink (no nft binary) as one batch,
// which the kernel commits atomically: every present or planned table of ours is
// deleted and the planned ones recreated, as the nft script does.
//
// The expressions mirror the bytecode nft 1.0.6 generates for the rendered text
// (checked with `nft --debug=netlink`), so `nft list` prints netlink-made rules in
// the same canonical text, and decodeRule reads rules written either way.
func flushRuleset(c *conn, rs *ruleset, present []tableID) error {
	if err := queueRuleset(c.Conn, rs, present); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netlink transaction: %w", err)
	}
	return nil
}

// deleteTables deletes the tables ids (of any family) in one transaction.
func deleteTables(c *conn, ids []tableID) error {
	for _, id := range ids {
		t := &gnft.Table{Family: tableFamily(id.family), Name: id.name}
		c.AddTable(t)
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netlink transaction: %w", err)
	}
	return nil
}

// anyTableID names a listed table of the ip, ip6 or inet family.
func anyTableID(t *gnft.Table) (tableID, bool) {
	switch t.Family {
	case gnft.TableFamilyIPv4:
		return tableID{"ip", t.Name}, true
	case gnft.TableFamilyIPv6:
		return tableID{"ip6", t.Name}, true
	case gnft.TableFamilyINet:
		return tableID{"inet", t.Name}, true
	}
	return tableID{}, false
}

func tableFamily(family string) gnft.TableFamily {
	switch family {
	case "ip6":
		return gnft.TableFamilyIPv6
	case "inet":
		return gnft.TableFamilyINet
	}
	return gnft.TableFamilyIPv4
}

// queueRuleset queues the whole transaction on c without sending it.
func queueRuleset(c *gnft.Conn, rs *ruleset, present []tableID) error {
	// Same table handling as transactionScript.
	for _, id := range tablesToReplace(rs, present) {
		if slices.Contains(present, id) {
			t := &gnft.Table{Family: tableFamily(id.family), Name: id.name}
			c.AddTable(t)
			c.DelTable(t)
		}
	}
	for i := range rs.tables {
		rt := &rs.tables[i]
		t := &gnft.Table{Family: tableFamily(familyName(rt.family)), Name: rt.name}
		if slices.Contains(present, rt.id()) {
			t = c.AddTable(t)
		} else {
			t = c.CreateTable(t)
		}
		chains := map[string]*gnft.Chain{}
		// All chains first, so jumps always find their target.
		for _, rc := range rt.chains {
			ch := &gnft.Chain{Name: rc.name, Table: t}
			if rc.base != nil {
				accept := gnft.ChainPolicyAccept
				ch.Type = gnft.ChainType(rc.base.typ)
				ch.Hooknum = gnft.ChainHookPrerouting
				if rc.base.hook == "output" {
					ch.Hooknum = gnft.ChainHookOutput
				}
				ch.Priority = gnft.ChainPriorityRef(gnft.ChainPriority(rc.base.priority))
				ch.Policy = &accept
			}
			chains[rc.name] = c.AddChain(ch)
		}
		addSet := func(key gnft.SetDatatype, elems [][]byte) (*gnft.Set, error) { return anonSet(c, t, key, elems) }
		for _, rc := range rt.chains {
			for j := range rc.rules {
				exprs, err := ruleExprs(rt.family, &rc.rules[j], addSet)
				if err != nil {
					return fmt.Errorf("netlink %s chain %s rule %d: %w", rt.id(), rc.name, j+1, err)
				}
				c.AddRule(&gnft.Rule{Table: t, Chain: chains[rc.name], Exprs: exprs})
			}
		}
	}
	return nil
}

func cmpOp(negate bool) expr.CmpOp {
	if negate {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

func l4proto(p redirect.Protocol) byte {
	if p == redirect.UDP {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

// ifname is an interface name as the kernel compares it: IFNAMSIZ bytes, NUL padded.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// anonSet queues a constant anonymous set, as nft does for `{ a, b }`.
func anonSet(c *gnft.Conn, t *gnft.Table, key gnft.SetDatatype, elems [][]byte) (*gnft.Set, error) {
	s := &gnft.Set{Table: t, Anonymous: true, Constant: true, KeyType: key}
	var vals []gnft.SetElement
	for _, e := range elems {
		vals = append(vals, gnft.SetElement{Key: e})
	}
	if err := c.AddSet(s, vals); err != nil {
		return nil, err
	}
	return s, nil
}

// setAdder makes the anonymous constant set a lookup refers to.
type setAdder func(key gnft.SetDatatype, elems [][]byte) (*gnft.Set, error)

func nfproto(f redirect.Family) byte {
	if f == redirect.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// addrLayout is the length of an address of the family and where the source and
// destination addresses are in its network header.
func addrLayout(f redirect.Family) (length, saddr, daddr uint32) {
	if f == redirect.IPv6 {
		return 16, 8, 24
	}
	return 4, 12, 16
}

// ruleExprs encodes one rule; decodeRule reads the same expressions back.
func ruleExprs(f redirect.Family, r *rule, addSet setAdder) ([]expr.Any, error) {
	var ex []expr.Any
	load := func(e expr.Any) { ex = append(ex, e) }
	// The protocol a port match checked; nft checks it once for all port matches.
	var checked redirect.Protocol
	addrLen, saddrOff, daddrOff := addrLayout(f)
	for _, m := range r.matches {
		switch m.kind {
		case redirect.MatchProtocol:
			load(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: []byte{l4proto(m.proto)}})
		case redirect.MatchInIface, redirect.MatchOutIface:
			key := expr.MetaKeyIIFNAME
			if m.kind == redirect.MatchOutIface {
				key = expr.MetaKeyOIFNAME
			}
			load(&expr.Meta{Key: key, Register: 1})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: ifname(m.iface)})
		case redirect.MatchSource, redirect.MatchDest:
			off := daddrOff
			if m.kind == redirect.MatchSource {
				off = saddrOff
			}
			addr := m.prefix.Addr().AsSlice()
			bits := m.prefix.Bits()
			if bits > 0 && bits%8 == 0 {
				// nft shortens a byte-aligned prefix to a shorter load, no mask.
				n := uint32(bits / 8)
				load(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
				load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: addr[:n]})
				continue
			}
			mask := make([]byte, addrLen)
			for i := 0; i < bits; i++ {
				mask[i/8] |= 0x80 >> (i % 8)
			}
			load(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: addrLen})
			load(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: addrLen, Mask: mask, Xor: make([]byte, addrLen)})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: addr})
		case redirect.MatchDestPort, redirect.MatchSourcePort:
			off := uint32(2)
			if m.kind == redirect.MatchSourcePort {
				off = 0
			}
			// The protocol the port belongs to, as nft's implicit dependency.
			if checked != m.proto {
				load(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1})
				load(&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4proto(m.proto)}})
				checked = m.proto
			}
			load(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2})
			if len(m.ports) == 1 {
				load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: binaryutil.BigEndian.PutUint16(m.ports[0])})
				continue
			}
			var elems [][]byte
			for _, p := range m.ports {
				elems = append(elems, binaryutil.BigEndian.PutUint16(p))
			}
			s, err := addSet(gnft.TypeInetService, elems)
			if err != nil {
				return nil, err
			}
			load(&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: m.negate})
		case redirect.MatchUIDOwner, redirect.MatchGIDOwner:
			key := expr.MetaKeySKUID
			if m.kind == redirect.MatchGIDOwner {
				key = expr.MetaKeySKGID
			}
			load(&expr.Meta{Key: key, Register: 1})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: binaryutil.NativeEndian.PutUint32(m.id)})
		case redirect.MatchMark:
			load(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: binaryutil.NativeEndian.PutUint32(m.mark)})
		case redirect.MatchConnMark:
			load(&expr.Ct{Key: expr.CtKeyMARK, Register: 1})
			load(&expr.Cmp{Op: cmpOp(m.negate), Register: 1, Data: binaryutil.NativeEndian.PutUint32(m.mark)})
		case redirect.MatchCTState:
			load(&expr.Ct{Key: expr.CtKeySTATE, Register: 1})
			single := m.states&(m.states-1) == 0
			switch {
			case single && m.negate:
				load(&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m.states)})
			case !m.negate:
				// Any of the states: the packet's one state bit is in the mask.
				load(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
					Mask: binaryutil.NativeEndian.PutUint32(m.states), Xor: make([]byte, 4)})
				load(&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
			default:
				var elems [][]byte
				for _, s := range ctStateBits {
					if m.states&s.bit != 0 {
						elems = append(elems, binaryutil.NativeEndian.PutUint32(s.bit))
					}
				}
				s, err := addSet(gnft.TypeCTState, elems)
				if err != nil {
					return nil, err
				}
				load(&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: true})
			}
		default:
			return nil, fmt.Errorf("match kind %d is not supported", m.kind)
		}
	}
	fam := nfproto(f)
	tg := r.target
	switch tg.Kind {
	case redirect.TargetJump:
		load(&expr.Verdict{Kind: expr.VerdictJump, Chain: tg.Chain})
	case redirect.TargetReturn:
		load(&expr.Verdict{Kind: expr.VerdictReturn})
	case redirect.TargetAccept:
		load(&expr.Verdict{Kind: expr.VerdictAccept})
	case redirect.TargetDrop:
		load(&expr.Verdict{Kind: expr.VerdictDrop})
	case redirect.TargetRedirect:
		load(&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(tg.Port)})
		load(&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	case redirect.TargetTProxy:
		load(&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(tg.Port)})
		load(&expr.TProxy{Family: fam, TableFamily: fam, RegPort: 1})
		load(&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(tg.Mark)})
		load(&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
		load(&expr.Verdict{Kind: expr.VerdictAccept})
	case redirect.TargetSetMark:
		load(&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(tg.Mark)})
		load(&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case redirect.TargetSaveMark:
		load(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1})
		load(&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 1})
	case redirect.TargetRestoreMark:
		load(&expr.Ct{Key: expr.CtKeyMARK, Register: 1})
		load(&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case redirect.TargetCTZone:
		load(&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint16(tg.Zone)})
		load(&expr.Ct{Key: expr.CtKeyZONE, SourceRegister: true, Register: 1})
	default:
		return nil, fmt.Errorf("target kind %d is not supported", tg.Kind)
	}
	return ex, nil
}
