package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Reading our tables back over netlink. Tables, chains and set elements come
// through github.com/google/nftables, the library that writes them. Rules do not:
// its rule dump drops every expression it has no type for (tproxy among them)
// without a trace, which would make a rule with such an expression look like one
// without it. So rules are dumped here and each expression is kept with its name;
// the ones the library can decode faithfully are decoded by it, ct and tproxy here
// (the library misreads both as the kernel dumps them). Rules and sets are dumped
// for every table at once, one round trip each however many tables we have.

// readAttempts bounds how often a read is repeated because the ruleset changed
// while it was read.
const readAttempts = 5

// readOurs reads our tables from the network namespace c was opened in. The dumps
// are taken between two reads of the ruleset's generation, and taken again if it
// changed, so the tables, chains, rules and sets are one consistent state.
func readOurs(c *gnft.Conn) ([]liveTable, error) {
	tables, err := ourTables(c)
	if err != nil || len(tables) == 0 {
		// A single dump is consistent by itself: nothing more to read.
		return nil, err
	}
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	for attempt := 1; ; attempt++ {
		before, err := generation(nl)
		if err != nil {
			return nil, err
		}
		live, readErr := readTables(c, nl)
		after, err := generation(nl)
		if err != nil {
			return nil, err
		}
		if before == after {
			return live, readErr
		}
		// Changed meanwhile; a failed read (a chain gone between two dumps) is
		// expected then.
		if attempt == readAttempts {
			return nil, fmt.Errorf("the ruleset changed during each of %d reads", attempt)
		}
	}
}

// ourTables lists the tables of ours.
func ourTables(c *gnft.Conn) ([]*gnft.Table, error) {
	all, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	var ours []*gnft.Table
	for _, t := range all {
		if fam, ok := familyOf(t.Family); ok && isOurs(tableID{family: familyName(fam), name: t.Name}) {
			ours = append(ours, t)
		}
	}
	return ours, nil
}

// tableFlags returns a listed table's flags. The library decodes them in host
// byte order; the kernel sends them in network byte order.
func tableFlags(t *gnft.Table) uint32 {
	return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, t.Flags))
}

func familyOf(f gnft.TableFamily) (redirect.Family, bool) {
	switch f {
	case gnft.TableFamilyIPv4:
		return redirect.IPv4, true
	case gnft.TableFamilyIPv6:
		return redirect.IPv6, true
	}
	return 0, false
}

var hookNames = map[gnft.ChainHook]string{
	unix.NF_INET_PRE_ROUTING:  "prerouting",
	unix.NF_INET_LOCAL_IN:     "input",
	unix.NF_INET_FORWARD:      "forward",
	unix.NF_INET_LOCAL_OUT:    "output",
	unix.NF_INET_POST_ROUTING: "postrouting",
}

// tableKey names a table as netlink messages do.
type tableKey struct {
	family gnft.TableFamily
	name   string
}

// readTables reads our tables in four dumps (tables, chains, rules, sets) however
// many there are, plus the elements of each set a rule looks up.
func readTables(c *gnft.Conn, nl *netlink.Conn) ([]liveTable, error) {
	tables, err := ourTables(c)
	if err != nil || len(tables) == 0 {
		return nil, err
	}
	ours := map[tableKey]bool{}
	for _, t := range tables {
		ours[tableKey{t.Family, t.Name}] = true
	}
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	rules, err := dumpRules(nl, ours)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	sets, err := dumpSets(nl, ours)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	var out []liveTable
	for _, t := range tables {
		key := tableKey{t.Family, t.Name}
		fam, _ := familyOf(t.Family)
		lt := liveTable{id: tableID{family: familyName(fam), name: t.Name}, family: fam, dormant: tableFlags(t)&unix.NFT_TABLE_F_DORMANT != 0}
		for _, ch := range chains {
			if ch.Table == nil || (tableKey{ch.Table.Family, ch.Table.Name}) != key {
				continue
			}
			lc := liveChain{name: ch.Name}
			if ch.Hooknum != nil {
				hook, ok := hookNames[*ch.Hooknum]
				if !ok {
					hook = fmt.Sprintf("%d", *ch.Hooknum)
				}
				lc.base = &baseChain{typ: string(ch.Type), hook: hook}
				if ch.Priority != nil {
					lc.base.priority = int(*ch.Priority)
				}
				lc.policy = "accept"
				if ch.Policy != nil && *ch.Policy == gnft.ChainPolicyDrop {
					lc.policy = "drop"
				}
			}
			lt.chains = append(lt.chains, lc)
		}
		tableSets := sets[key]
		if err := readElements(c, t, rules[key], tableSets); err != nil {
			return nil, fmt.Errorf("list sets of table %s: %w", lt.id, err)
		}
		for name, s := range tableSets {
			if !s.anonymous {
				lt.sets = append(lt.sets, name)
			}
		}
		slices.Sort(lt.sets)
		for _, r := range rules[key] {
			lc := lt.chain(r.chain)
			if lc == nil {
				return nil, fmt.Errorf("table %s: rule %d of chain %s, which was not listed", lt.id, r.handle, r.chain)
			}
			lr := liveRule{handle: r.handle}
			lr.rule, lr.ok, lr.text = decodeRule(fam, r.exprs, tableSets)
			for _, e := range r.exprs {
				if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
					lr.jump = v.Chain
				}
			}
			lc.rules = append(lc.rules, lr)
		}
		out = append(out, lt)
	}
	return out, nil
}

// readElements reads the keys of the sets a table's rules look up: the anonymous
// sets of multi-valued matches.
func readElements(c *gnft.Conn, t *gnft.Table, rules []dumpedRule, sets map[string]liveSet) error {
	for _, r := range rules {
		for _, e := range r.exprs {
			l, ok := e.(*expr.Lookup)
			if !ok {
				continue
			}
			s, found := sets[l.SetName]
			if !found || s.keys != nil {
				continue
			}
			elems, err := c.GetSetElements(&gnft.Set{Table: t, Name: l.SetName})
			if err != nil {
				return fmt.Errorf("set %s: %w", l.SetName, err)
			}
			s.keys = [][]byte{}
			for _, e := range elems {
				s.keys = append(s.keys, e.Key)
			}
			sets[l.SetName] = s
		}
	}
	return nil
}

// dumpedRule is one rule of a rule dump, its expressions undecoded as rules yet.
type dumpedRule struct {
	chain  string
	handle uint64
	exprs  []any
}

func nftMsgType(msg int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg)
}

// nfgenmsg is the header every nf_tables message starts with.
func nfgenmsg(family byte) []byte { return []byte{family, unix.NFNETLINK_V0, 0, 0} }

// generation reads the ruleset's generation, which every committed change
// increments.
func generation(nl *netlink.Conn) (uint32, error) {
	msgs, err := nl.Execute(netlink.Message{
		Header: netlink.Header{Type: nftMsgType(unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   nfgenmsg(unix.AF_UNSPEC),
	})
	if err != nil {
		return 0, fmt.Errorf("read the ruleset generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != nftMsgType(unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
			continue
		}
		var gen uint32
		found := false
		err := decodeAttrs(m.Data[4:], func(ad *netlink.AttributeDecoder) {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen, found = ad.Uint32(), true
			}
		})
		if err != nil || found {
			return gen, err
		}
	}
	return 0, errors.New("read the ruleset generation: no generation in the reply")
}

// dump runs one nf_tables dump of every family's objects of a kind.
func dump(nl *netlink.Conn, msgType int) ([]netlink.Message, error) {
	return nl.Execute(netlink.Message{
		Header: netlink.Header{Type: nftMsgType(msgType), Flags: netlink.Request | netlink.Dump},
		Data:   nfgenmsg(unix.AF_UNSPEC),
	})
}

// dumpRules reads the rules of our tables, chain by chain in order, in one dump.
func dumpRules(nl *netlink.Conn, ours map[tableKey]bool) (map[tableKey][]dumpedRule, error) {
	msgs, err := dump(nl, unix.NFT_MSG_GETRULE)
	if err != nil {
		return nil, err
	}
	out := map[tableKey][]dumpedRule{}
	for _, m := range msgs {
		if m.Header.Type != nftMsgType(unix.NFT_MSG_NEWRULE) || len(m.Data) < 4 {
			continue
		}
		key, r, err := parseRule(m.Data[0], m.Data[4:], ours)
		if err != nil {
			return nil, err
		}
		if ours[key] {
			out[key] = append(out[key], r)
		}
	}
	return out, nil
}

// parseRule reads one rule message; the expressions only of a rule of ours.
func parseRule(fam byte, data []byte, ours map[tableKey]bool) (tableKey, dumpedRule, error) {
	key := tableKey{family: gnft.TableFamily(fam)}
	var r dumpedRule
	err := decodeAttrs(data, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			key.name = ad.String()
		case unix.NFTA_RULE_CHAIN:
			r.chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_EXPRESSIONS:
			// The kernel puts the table first. Were it not so, a rule of ours would
			// read as one without expressions: a difference, never a false match.
			if !ours[key] {
				return
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					if list.Type() != unix.NFTA_LIST_ELEM {
						continue
					}
					list.Nested(func(elem *netlink.AttributeDecoder) error {
						e, err := parseExpr(fam, elem)
						if err != nil {
							return err
						}
						r.exprs = append(r.exprs, e)
						return nil
					})
				}
				return nil
			})
		}
	})
	if err != nil {
		return key, r, fmt.Errorf("rule %d of chain %s: %w", r.handle, r.chain, err)
	}
	return key, r, nil
}

// dumpSets reads the sets of our tables (not their elements) in one dump.
func dumpSets(nl *netlink.Conn, ours map[tableKey]bool) (map[tableKey]map[string]liveSet, error) {
	msgs, err := dump(nl, unix.NFT_MSG_GETSET)
	if err != nil {
		return nil, err
	}
	out := map[tableKey]map[string]liveSet{}
	for _, m := range msgs {
		if m.Header.Type != nftMsgType(unix.NFT_MSG_NEWSET) || len(m.Data) < 4 {
			continue
		}
		key := tableKey{family: gnft.TableFamily(m.Data[0])}
		var name string
		var flags uint32
		err := decodeAttrs(m.Data[4:], func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_SET_TABLE:
				key.name = ad.String()
			case unix.NFTA_SET_NAME:
				name = ad.String()
			case unix.NFTA_SET_FLAGS:
				flags = ad.Uint32()
			}
		})
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		if !ours[key] {
			continue
		}
		if out[key] == nil {
			out[key] = map[string]liveSet{}
		}
		out[key][name] = liveSet{
			anonymous: flags&unix.NFT_SET_ANONYMOUS != 0,
			constant:  flags&unix.NFT_SET_CONSTANT != 0,
			interval:  flags&unix.NFT_SET_INTERVAL != 0,
			isMap:     flags&(unix.NFT_SET_MAP|unix.NFT_SET_OBJECT) != 0,
		}
	}
	return out, nil
}

// parseExpr reads one expression (NFTA_EXPR_NAME and NFTA_EXPR_DATA).
func parseExpr(fam byte, ad *netlink.AttributeDecoder) (any, error) {
	var name string
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			name = ad.String()
		case unix.NFTA_EXPR_DATA:
			data = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return nil, err
	}
	var e expr.Any
	switch name {
	case "ct":
		return parseCt(data)
	case "tproxy":
		return parseTProxy(data)
	case "meta":
		e = &expr.Meta{}
	case "cmp":
		e = &expr.Cmp{}
	case "payload":
		e = &expr.Payload{}
	case "bitwise":
		e = &expr.Bitwise{}
	case "lookup":
		e = &expr.Lookup{}
	case "redir":
		e = &expr.Redir{}
	case "counter":
		e = &expr.Counter{}
	case "immediate":
		im := &expr.Immediate{}
		if err := expr.Unmarshal(fam, data, im); err != nil {
			return nil, fmt.Errorf("expression %s: %w", name, err)
		}
		if im.Register != unix.NFT_REG_VERDICT {
			return im, nil
		}
		// A value for the verdict register is the verdict.
		e = &expr.Verdict{}
	default:
		return opaqueExpr{name: name}, nil
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		return nil, fmt.Errorf("expression %s: %w", name, err)
	}
	return e, nil
}

// parseCt reads a ct expression, telling a load (destination register) from a
// set (source register).
func parseCt(data []byte) (any, error) {
	e := &expr.Ct{}
	err := decodeAttrs(data, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_CT_KEY:
			e.Key = expr.CtKey(ad.Uint32())
		case unix.NFTA_CT_DREG:
			e.Register = ad.Uint32()
		case unix.NFTA_CT_SREG:
			e.Register, e.SourceRegister = ad.Uint32(), true
		case unix.NFTA_CT_DIRECTION:
			e.Direction = uint32(ad.Uint8())
		}
	})
	return e, err
}

// parseTProxy reads a tproxy expression (the kernel dumps its family as 32 bits).
func parseTProxy(data []byte) (any, error) {
	e := &expr.TProxy{}
	err := decodeAttrs(data, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case expr.NFTA_TPROXY_FAMILY:
			e.Family = byte(ad.Uint32())
		case expr.NFTA_TPROXY_REG_ADDR:
			e.RegAddr = ad.Uint32()
		case expr.NFTA_TPROXY_REG_PORT:
			e.RegPort = ad.Uint32()
		}
	})
	return e, err
}

// decodeAttrs calls each for every netlink attribute in data, which nf_tables
// writes big-endian.
func decodeAttrs(data []byte, each func(ad *netlink.AttributeDecoder)) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		each(ad)
	}
	return ad.Err()
}
