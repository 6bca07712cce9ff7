package nftables

import (
	"errors"
	"fmt"
	"net/netip"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// TablePrefix starts the name of every table this backend owns.
const TablePrefix = "istio-proxy-"

// TableName is the nftables table that holds a netfilter table's rules of a plan.
func TableName(t redirect.Table) string { return TablePrefix + string(t) }

// tableID names one table: nft family keyword and table name.
type tableID struct {
	family string
	name   string
}

func (id tableID) String() string { return id.family + " " + id.name }

func familyName(f redirect.Family) string {
	if f == redirect.IPv6 {
		return "ip6"
	}
	return "ip"
}

// ruleset is a plan translated to nftables, normalized to the form nft lists it
// in: implied protocol matches dropped, groups resolved to gids, sets sorted. Both
// the text renderer and the netlink encoder work from it, so they cannot disagree.
type ruleset struct {
	tables []table
}

type table struct {
	family redirect.Family
	name   string
	chains []chain
}

func (t *table) id() tableID { return tableID{family: familyName(t.family), name: t.name} }

type chain struct {
	name  string
	base  *baseChain // nil for a regular chain
	rules []rule
}

// baseChain is a chain attached to a netfilter hook.
type baseChain struct {
	typ      string // filter, nat, route
	hook     string // prerouting, output
	priority int
}

type rule struct {
	matches []match
	target  redirect.Target
}

// match is a redirect.Match with what nft needs made explicit: port matches carry
// their protocol, owners are numeric.
type match struct {
	kind   redirect.MatchKind
	negate bool
	proto  redirect.Protocol
	iface  string
	prefix netip.Prefix
	ports  []uint16
	id     uint32 // uid or gid
	mark   uint32
	states uint32 // conntrack state bits
}

// Conntrack state bits, as the kernel (and nft's listing order) defines them.
const (
	ctStateInvalid     = 1
	ctStateEstablished = 2
	ctStateRelated     = 4
)

var ctStateBits = []struct {
	bit  uint32
	name string
}{{ctStateInvalid, "invalid"}, {ctStateEstablished, "established"}, {ctStateRelated, "related"}}

// Hook priorities (nft's standard priority names).
const (
	priorityRaw    = -300
	priorityMangle = -150
	priorityDstNAT = -100
	priorityFilter = 0
)

// baseChainFor maps a built-in chain of a netfilter table onto an nftables base
// chain with the same place in the packet path as iptables' own chain.
func baseChainFor(t redirect.Table, builtin string) (string, *baseChain, error) {
	var hook string
	switch builtin {
	case redirect.ChainPrerouting:
		hook = "prerouting"
	case redirect.ChainOutput:
		hook = "output"
	default:
		return "", nil, fmt.Errorf("hook %s is not supported", builtin)
	}
	b := &baseChain{typ: "filter", hook: hook}
	switch t {
	case redirect.TableNAT:
		b.typ, b.priority = "nat", priorityDstNAT
	case redirect.TableMangle:
		b.priority = priorityMangle
		if hook == "output" {
			// iptables' mangle OUTPUT reroutes a packet whose mark changed; only a
			// route chain does that in nftables.
			b.typ = "route"
		}
	case redirect.TableRaw:
		b.priority = priorityRaw
	case redirect.TableFilter:
		b.priority = priorityFilter
	default:
		return "", nil, fmt.Errorf("netfilter table %s is not supported", t)
	}
	return hook, b, nil
}

// GroupLookup resolves a group name to its gid.
type GroupLookup func(name string) (uint32, error)

// systemGroups resolves names the way iptables' --gid-owner does: through the
// host's group database, when the rules are made.
func systemGroups(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return numericID("group", name, "gid", g.Gid)
}

// systemUsers is systemGroups for --uid-owner: the host's user database.
func systemUsers(name string) (uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, err
	}
	return numericID("user", name, "uid", u.Uid)
}

// numericID parses the id the database gave for a user or group name.
func numericID(kind, name, idKind, id string) (uint32, error) {
	n, err := strconv.ParseUint(id, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s %q has non-numeric %s %q", kind, name, idKind, id)
	}
	return uint32(n), nil
}

// Render returns the nft script that creates the plan's tables, in the exact text
// `nft list table` prints for them. Group names are resolved to gids through the
// host's group database.
func Render(plan *redirect.Plan) (string, error) {
	rs, err := translate(plan, systemGroups)
	if err != nil {
		return "", err
	}
	return rs.text(), nil
}

// translate builds the normalized ruleset of a plan.
func translate(plan *redirect.Plan, groups GroupLookup) (*ruleset, error) {
	if plan == nil {
		return nil, errors.New("render nftables: no plan")
	}
	rs := &ruleset{}
	for _, fp := range plan.Families {
		for _, tp := range fp.Tables {
			t, err := translateTable(fp.Family, &tp, groups)
			if err != nil {
				return nil, fmt.Errorf("render nftables %s %s: %w", fp.Family, tp.Table, err)
			}
			rs.tables = append(rs.tables, t)
		}
	}
	return rs, nil
}

func translateTable(f redirect.Family, tp *redirect.TablePlan, groups GroupLookup) (table, error) {
	t := table{family: f, name: TableName(tp.Table)}
	final, err := tp.FinalChains()
	if err != nil {
		return t, err
	}
	// Base chains first, in hook order, then ours in the order the plan declares them:
	// the order nft lists chains it created in that order.
	for _, builtin := range []string{redirect.ChainPrerouting, redirect.ChainOutput} {
		if len(final[builtin]) == 0 {
			continue
		}
		name, base, err := baseChainFor(tp.Table, builtin)
		if err != nil {
			return t, err
		}
		c, err := translateChain(name, base, f, final[builtin], groups)
		if err != nil {
			return t, err
		}
		t.chains = append(t.chains, c)
	}
	for chainName := range final {
		if redirect.IsBuiltin(chainName) && chainName != redirect.ChainPrerouting && chainName != redirect.ChainOutput {
			return t, fmt.Errorf("hook %s is not supported", chainName)
		}
	}
	for _, name := range tp.Chains {
		c, err := translateChain(name, nil, f, final[name], groups)
		if err != nil {
			return t, err
		}
		t.chains = append(t.chains, c)
	}
	return t, nil
}

func translateChain(name string, base *baseChain, f redirect.Family, rules []redirect.Rule, groups GroupLookup) (chain, error) {
	c := chain{name: name, base: base}
	for i, r := range rules {
		nr, err := translateRule(f, r, groups)
		if err != nil {
			return c, fmt.Errorf("chain %s rule %d: %w", name, i+1, err)
		}
		c.rules = append(c.rules, nr)
		if r.Target.Kind == redirect.TargetTProxy {
			// iptables' TPROXY drops a packet for which no socket is found; nft's
			// tproxy statement instead ends the rule and evaluation goes on. The same
			// matches followed by drop keep iptables' meaning.
			c.rules = append(c.rules, rule{matches: nr.matches, target: redirect.Target{Kind: redirect.TargetDrop}})
		}
	}
	return c, nil
}

func translateRule(f redirect.Family, r redirect.Rule, groups GroupLookup) (rule, error) {
	var proto redirect.Protocol
	hasPorts := false
	for _, m := range r.Matches {
		switch m.Kind {
		case redirect.MatchProtocol:
			if m.Negate {
				continue
			}
			if proto != "" && proto != m.Proto {
				return rule{}, fmt.Errorf("protocols %s and %s in one rule", proto, m.Proto)
			}
			proto = m.Proto
		case redirect.MatchDestPort, redirect.MatchSourcePort:
			hasPorts = true
		}
	}
	out := rule{target: targetFields(r.Target)}
	for _, m := range r.Matches {
		nm := match{kind: m.Kind, negate: m.Negate}
		switch m.Kind {
		case redirect.MatchProtocol:
			if m.Proto != redirect.TCP && m.Proto != redirect.UDP {
				return rule{}, fmt.Errorf("protocol %q is not supported", m.Proto)
			}
			// A port match implies its protocol; nft lists the rule without the
			// protocol match, so the canonical form leaves it out.
			if hasPorts && !m.Negate {
				continue
			}
			nm.proto = m.Proto
		case redirect.MatchInIface, redirect.MatchOutIface:
			if err := redirect.ValidateInterfaceName(m.Iface); err != nil {
				return rule{}, err
			}
			nm.iface = m.Iface
		case redirect.MatchSource, redirect.MatchDest:
			p := m.Prefix.Masked()
			if !p.IsValid() {
				return rule{}, fmt.Errorf("invalid address match %q", m.Prefix)
			}
			if p.Addr().Is4() != (f == redirect.IPv4) {
				return rule{}, fmt.Errorf("address %s does not belong to family %s", p, f)
			}
			nm.prefix = p
		case redirect.MatchDestPort, redirect.MatchSourcePort:
			if proto == "" {
				return rule{}, errors.New("port match without a protocol")
			}
			if len(m.Ports) == 0 {
				return rule{}, errors.New("port match without ports")
			}
			nm.proto = proto
			nm.ports = slices.Compact(slices.Sorted(slices.Values(m.Ports)))
		case redirect.MatchUIDOwner:
			id, err := ownerID(m.Owner, systemUsers)
			if err != nil {
				return rule{}, fmt.Errorf("uid owner: %w", err)
			}
			nm.id = id
		case redirect.MatchGIDOwner:
			id, err := ownerID(m.Owner, groups)
			if err != nil {
				return rule{}, fmt.Errorf("gid owner: %w", err)
			}
			nm.id = id
		case redirect.MatchMark, redirect.MatchConnMark:
			nm.mark = m.Mark
		case redirect.MatchCTState:
			for _, s := range m.CTStates {
				switch s {
				case redirect.CTInvalid:
					nm.states |= ctStateInvalid
				case redirect.CTEstablished:
					nm.states |= ctStateEstablished
				case redirect.CTRelated:
					nm.states |= ctStateRelated
				default:
					return rule{}, fmt.Errorf("conntrack state %q is not supported", s)
				}
			}
			if nm.states == 0 {
				return rule{}, errors.New("conntrack state match without states")
			}
		default:
			return rule{}, fmt.Errorf("match kind %d is not supported", m.Kind)
		}
		out.matches = append(out.matches, nm)
	}
	switch r.Target.Kind {
	case redirect.TargetJump:
		if r.Target.Chain == "" {
			return rule{}, errors.New("jump without a chain")
		}
	case redirect.TargetRedirect, redirect.TargetTProxy:
		// nft maps the port of a transport protocol; without one it refuses the rule.
		if proto == "" {
			return rule{}, errors.New("redirect without a protocol")
		}
		if r.Target.Port == 0 {
			return rule{}, errors.New("redirect to port 0")
		}
	case redirect.TargetReturn, redirect.TargetAccept, redirect.TargetDrop, redirect.TargetSetMark,
		redirect.TargetSaveMark, redirect.TargetRestoreMark, redirect.TargetCTZone:
	default:
		return rule{}, fmt.Errorf("target kind %d is not supported", r.Target.Kind)
	}
	return out, nil
}

// targetFields keeps the fields a target of its kind uses: only those reach the
// kernel, so only those can be compared with a rule read back.
func targetFields(t redirect.Target) redirect.Target {
	out := redirect.Target{Kind: t.Kind}
	switch t.Kind {
	case redirect.TargetJump:
		out.Chain = t.Chain
	case redirect.TargetRedirect:
		out.Port = t.Port
	case redirect.TargetTProxy:
		out.Port, out.Mark = t.Port, t.Mark
	case redirect.TargetSetMark:
		out.Mark = t.Mark
	case redirect.TargetCTZone:
		out.Zone = t.Zone
	}
	return out
}

// ownerID turns a numeric id or a name into an id.
func ownerID(owner string, lookup GroupLookup) (uint32, error) {
	if owner == "" {
		return 0, errors.New("empty owner")
	}
	if id, err := strconv.ParseUint(owner, 10, 32); err == nil {
		return uint32(id), nil
	}
	id, err := lookup(owner)
	if err != nil {
		return 0, fmt.Errorf("resolve %q: %w", owner, err)
	}
	return id, nil
}

// text renders the ruleset the way `nft list ruleset` prints these tables.
func (rs *ruleset) text() string {
	var b strings.Builder
	for i := range rs.tables {
		rs.tables[i].write(&b)
	}
	return b.String()
}

func (t *table) write(b *strings.Builder) {
	fmt.Fprintf(b, "table %s {\n", t.id())
	for i, c := range t.chains {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(b, "\tchain %s {\n", c.name)
		if c.base != nil {
			fmt.Fprintf(b, "\t\t%s\n", c.base.text())
		}
		for _, r := range c.rules {
			fmt.Fprintf(b, "\t\t%s\n", r.text(t.family))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
}

func (bc *baseChain) text() string { return bc.textWithPolicy("accept") }

func (bc *baseChain) textWithPolicy(policy string) string {
	return fmt.Sprintf("type %s hook %s priority %s; policy %s;", bc.typ, bc.hook, priorityText(bc.hook, bc.priority), policy)
}

// priorityText prints a priority as nft does: by its standard name where that name
// is defined for the hook, as a number otherwise.
func priorityText(hook string, p int) string {
	switch {
	case p == priorityRaw:
		return "raw"
	case p == priorityMangle:
		return "mangle"
	case p == priorityDstNAT && hook == "prerouting":
		return "dstnat"
	case p == priorityFilter:
		return "filter"
	}
	return strconv.Itoa(p)
}

func (r *rule) text(f redirect.Family) string {
	var parts []string
	for _, m := range r.matches {
		parts = append(parts, m.text(f))
	}
	parts = append(parts, targetText(r.target))
	return strings.Join(parts, " ")
}

func op(negate bool) string {
	if negate {
		return "!= "
	}
	return ""
}

func (m *match) text(f redirect.Family) string {
	switch m.kind {
	case redirect.MatchProtocol:
		return "meta l4proto " + op(m.negate) + string(m.proto)
	case redirect.MatchInIface:
		return "iifname " + op(m.negate) + strconv.Quote(m.iface)
	case redirect.MatchOutIface:
		return "oifname " + op(m.negate) + strconv.Quote(m.iface)
	case redirect.MatchSource:
		return addrKeyword(f) + " saddr " + op(m.negate) + prefixText(m.prefix)
	case redirect.MatchDest:
		return addrKeyword(f) + " daddr " + op(m.negate) + prefixText(m.prefix)
	case redirect.MatchDestPort:
		return string(m.proto) + " dport " + op(m.negate) + portsText(m.ports)
	case redirect.MatchSourcePort:
		return string(m.proto) + " sport " + op(m.negate) + portsText(m.ports)
	case redirect.MatchUIDOwner:
		return "meta skuid " + op(m.negate) + strconv.FormatUint(uint64(m.id), 10)
	case redirect.MatchGIDOwner:
		return "meta skgid " + op(m.negate) + strconv.FormatUint(uint64(m.id), 10)
	case redirect.MatchMark:
		return "meta mark " + op(m.negate) + markText(m.mark)
	case redirect.MatchConnMark:
		return "ct mark " + op(m.negate) + markText(m.mark)
	case redirect.MatchCTState:
		var names []string
		for _, s := range ctStateBits {
			if m.states&s.bit != 0 {
				names = append(names, s.name)
			}
		}
		switch {
		case !m.negate:
			return "ct state " + strings.Join(names, ",")
		case len(names) == 1:
			return "ct state != " + names[0]
		}
		// Not "ct state != a | b": nft compares that with the OR of the bits, which
		// every packet (having one state) passes. A set lookup is iptables' meaning.
		return "ct state != { " + strings.Join(names, ", ") + " }"
	}
	panic(fmt.Sprintf("nftables: match kind %d escaped translation", m.kind))
}

// fixedTargets are the targets nft writes as one fixed statement.
var fixedTargets = map[redirect.TargetKind]string{
	redirect.TargetReturn:      "return",
	redirect.TargetAccept:      "accept",
	redirect.TargetDrop:        "drop",
	redirect.TargetSaveMark:    "ct mark set meta mark",
	redirect.TargetRestoreMark: "meta mark set ct mark",
}

func targetText(t redirect.Target) string {
	if text, ok := fixedTargets[t.Kind]; ok {
		return text
	}
	switch t.Kind {
	case redirect.TargetJump:
		return "jump " + t.Chain
	case redirect.TargetRedirect:
		return fmt.Sprintf("redirect to :%d", t.Port)
	case redirect.TargetTProxy:
		// iptables' TPROXY marks the packet and accepts it; nft splits that into
		// tproxy, a mark statement and the verdict.
		return fmt.Sprintf("tproxy to :%d meta mark set %s accept", t.Port, markText(t.Mark))
	case redirect.TargetSetMark:
		return "meta mark set " + markText(t.Mark)
	case redirect.TargetCTZone:
		return fmt.Sprintf("ct zone set %d", t.Zone)
	}
	panic(fmt.Sprintf("nftables: target kind %d escaped translation", t.Kind))
}

func addrKeyword(f redirect.Family) string {
	if f == redirect.IPv6 {
		return "ip6"
	}
	return "ip"
}

// prefixText prints a host route as a bare address, as nft does.
func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func portsText(ports []uint16) string {
	if len(ports) == 1 {
		return strconv.Itoa(int(ports[0]))
	}
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

func markText(m uint32) string { return fmt.Sprintf("0x%08x", m) }

// transactionScript is the nft -f input that replaces our tables with the ruleset
// in one transaction. Tables of ours found live (present) are deleted whole, never
// flushed, so everyone else's rules stay; "add table" before "delete table" makes
// the delete succeed even if the table vanished since it was listed. Tables that
// were absent are made with "create table", which fails the whole transaction if
// one appeared meanwhile (Apply then lists again and retries), instead of add and
// delete: deleting a table costs the kernel an RCU grace period, which measured as
// 18ms instead of 7ms for a fresh namespace's apply. The ruleset's tables are
// made in its order, each made or remade where it comes, so that nft lists them
// as the ruleset renders whatever tables were there before (made before every
// remade one, a new table was listed first).
func transactionScript(rs *ruleset, present []tableID) string {
	var replace []tableID
	for _, id := range tablesToReplace(rs, present) {
		if slices.Contains(present, id) {
			replace = append(replace, id)
		}
	}
	var b strings.Builder
	b.WriteString(deleteScript(replace))
	for i := range rs.tables {
		t := &rs.tables[i]
		if !slices.Contains(present, t.id()) {
			fmt.Fprintf(&b, "create table %s\n", t.id())
		}
		t.write(&b)
	}
	return b.String()
}

// tablesToReplace is every table of the ruleset plus every present table of ours,
// each once, in a stable order.
func tablesToReplace(rs *ruleset, present []tableID) []tableID {
	var ids []tableID
	for i := range rs.tables {
		ids = append(ids, rs.tables[i].id())
	}
	for _, id := range present {
		if isOurs(id) && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func deleteScript(ids []tableID) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "add table %s\ndelete table %s\n", id, id)
	}
	return b.String()
}
