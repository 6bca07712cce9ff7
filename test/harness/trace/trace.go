package trace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Direction says which netfilter hook a packet traverses.
type Direction uint8

const (
	// Outbound packets are generated locally and traverse the OUTPUT hook.
	Outbound Direction = iota + 1
	// Inbound packets arrive on an interface and traverse the PREROUTING hook.
	Inbound
)

func (d Direction) String() string {
	switch d {
	case Outbound:
		return "outbound"
	case Inbound:
		return "inbound"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// CTNew is the conntrack state of a connection's first packet, and a Packet's default.
const CTNew redirect.CTState = "NEW"

// Packet is what the tracer sends through a plan.
type Packet struct {
	// Family selects the plan's family; zero means the family of Dst.
	Family    redirect.Family
	Direction Direction
	Src, Dst  netip.Addr
	// Proto is the layer 4 protocol; port matches need TCP or UDP.
	Proto            redirect.Protocol
	SrcPort, DstPort uint16

	// The sending socket's credentials, seen by owner matches (outbound only).
	// UID and GID are the file system uid and gid (xt_owner's fsuid/fsgid).
	UID, GID uint32
	// GroupName is GID's name, as the node resolves it: iptables resolves a group name
	// in --gid-owner to its id when the rule is installed.
	GroupName string
	// Groups are the process's supplementary groups. xt_owner's --gid-owner checks
	// them only with --suppl-groups, which no plan uses, so they never select a
	// packet: they are here so tests can show that.
	Groups []string
	// NoSocket marks a packet the kernel sends on no socket's behalf (a RST, an ICMP
	// error): an owner match then holds only when negated, as in xt_owner.
	NoSocket bool

	// InIface is the interface an inbound packet arrives on. OutIface is the route's
	// interface for an outbound packet: "lo" for local destinations (the pod's own
	// addresses, loopback), else e.g. "eth0".
	InIface, OutIface string

	Mark, ConnMark uint32
	// CTState is the conntrack state; empty means NEW.
	CTState redirect.CTState
}

func (p Packet) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s -> %s", p.Direction, p.Proto,
		netip.AddrPortFrom(p.Src, p.SrcPort), netip.AddrPortFrom(p.Dst, p.DstPort))
	if p.Direction == Outbound {
		if p.NoSocket {
			b.WriteString(" no-socket")
		} else {
			fmt.Fprintf(&b, " uid %d gid %d", p.UID, p.GID)
		}
		if p.GroupName != "" {
			fmt.Fprintf(&b, " (%s)", p.GroupName)
		}
		if len(p.Groups) > 0 {
			fmt.Fprintf(&b, " groups %s", strings.Join(p.Groups, ","))
		}
		fmt.Fprintf(&b, " out %s", p.OutIface)
	} else {
		fmt.Fprintf(&b, " in %s", p.InIface)
	}
	if p.Mark != 0 {
		fmt.Fprintf(&b, " mark %d", p.Mark)
	}
	if p.ConnMark != 0 {
		fmt.Fprintf(&b, " connmark %d", p.ConnMark)
	}
	if p.CTState != "" {
		fmt.Fprintf(&b, " %s", p.CTState)
	}
	return b.String()
}

// Action is where a traced packet lands.
type Action uint8

const (
	// Passed: not captured; the packet goes on to its destination.
	Passed Action = iota + 1
	// Redirected: NAT REDIRECT to a local port.
	Redirected
	// TProxied: handed to the local socket on a port by TPROXY, with a mark.
	TProxied
	// Dropped: the packet was dropped.
	Dropped
)

func (a Action) String() string {
	switch a {
	case Passed:
		return "passed"
	case Redirected:
		return "redirected"
	case TProxied:
		return "tproxied"
	case Dropped:
		return "dropped"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Verdict is the outcome of a trace.
type Verdict struct {
	Action Action
	// Port is the local port for Redirected and TProxied.
	Port uint16
	// Mark and ConnMark are the packet and connection marks after the hook.
	Mark, ConnMark uint32
	// Zone is the conntrack zone a CT target put the packet in; 0 is the default zone.
	Zone uint16
	// Trace lists the rules that matched, in order, with notes on what the kernel
	// did without a rule.
	Trace []Step
}

// Step is one matched rule (Index > 0) or one note (Index 0) of a trace.
type Step struct {
	Table redirect.Table
	Chain string
	// Index is the 1-based position of Rule in the chain's final rules.
	Index int
	Rule  redirect.Rule
	Note  string
}

func (s Step) String() string {
	if s.Index == 0 {
		return fmt.Sprintf("%s %s: %s", s.Table, s.Chain, s.Note)
	}
	return fmt.Sprintf("%s %s #%d: %s", s.Table, s.Chain, s.Index, formatRule(s.Rule))
}

func (v Verdict) String() string {
	var b strings.Builder
	b.WriteString(v.Action.String())
	if v.Action == Redirected || v.Action == TProxied {
		fmt.Fprintf(&b, " to port %d", v.Port)
	}
	fmt.Fprintf(&b, " (mark %d, connmark %d, zone %d)", v.Mark, v.ConnMark, v.Zone)
	for _, s := range v.Trace {
		b.WriteString("\n  ")
		b.WriteString(s.String())
	}
	return b.String()
}

// Netfilter's order of our tables on each hook: raw (-300), mangle (-150), nat (-100),
// filter (0). The filter table has no PREROUTING chain.
var hookTables = map[Direction][]redirect.Table{
	Inbound:  {redirect.TableRaw, redirect.TableMangle, redirect.TableNAT},
	Outbound: {redirect.TableRaw, redirect.TableMangle, redirect.TableNAT, redirect.TableFilter},
}

// maxJumpDepth bounds nested jumps; iptables itself refuses loops.
const maxJumpDepth = 64

// Trace sends pkt through plan's hook for its direction and reports where it lands.
// It models what the kernel does, not only the rules: the nat table sees only a
// connection's first packet, a CT target does nothing once the packet has conntrack,
// and owner matches see only the socket's fsuid and fsgid. It does not model the
// re-routing that a changed mark or address causes after the hook.
// It fails on a malformed packet and on a plan the kernel would not load.
func Trace(plan *redirect.Plan, pkt Packet) (Verdict, error) {
	pkt, err := pkt.normalize()
	if err != nil {
		return Verdict{}, fmt.Errorf("trace %s: %w", pkt, err)
	}
	t := &tracer{pkt: pkt, mark: pkt.Mark, connMark: pkt.ConnMark, v: Verdict{Action: Passed}}
	t.ctAttached = pkt.loopedBack()
	hook := redirect.ChainOutput
	if pkt.Direction == Inbound {
		hook = redirect.ChainPrerouting
	}
	t.hook = hook
	if fp := plan.Family(pkt.Family); fp != nil {
		if pkt.Direction == Inbound {
			if tp := fp.Table(redirect.TableFilter); tp != nil && slices.ContainsFunc(tp.Rules, func(r redirect.Rule) bool { return r.Chain == redirect.ChainPrerouting }) {
				return Verdict{}, fmt.Errorf("trace %s: filter table has rules in PREROUTING, a chain it does not have", pkt)
			}
		}
		for _, table := range hookTables[pkt.Direction] {
			tp := fp.Table(table)
			if tp == nil {
				continue
			}
			if table == redirect.TableNAT {
				if skip := t.natSkipped(); skip != "" {
					t.note(table, hook, skip)
					continue
				}
			}
			stop, err := t.runTable(tp)
			if err != nil {
				return Verdict{}, fmt.Errorf("trace %s: %s %s: %w", pkt, pkt.Family, table, err)
			}
			if stop {
				break
			}
		}
	} else {
		t.note("", hook, fmt.Sprintf("no %s rules in the plan", pkt.Family))
	}
	t.v.Mark, t.v.ConnMark = t.mark, t.connMark
	return t.v, nil
}

// normalize fills the defaults and refuses packets the kernel could not produce.
func (p Packet) normalize() (Packet, error) {
	if p.Direction != Outbound && p.Direction != Inbound {
		return p, errors.New("direction must be Outbound or Inbound")
	}
	if !p.Dst.IsValid() || !p.Src.IsValid() {
		return p, errors.New("source and destination addresses are required")
	}
	if p.Family == 0 {
		p.Family = redirect.IPv4
		if p.Dst.Is6() {
			p.Family = redirect.IPv6
		}
	}
	for _, a := range []netip.Addr{p.Src, p.Dst} {
		switch {
		case a.Zone() != "":
			return p, fmt.Errorf("address %s has a zone", a)
		case p.Family == redirect.IPv4 && !a.Is4(), p.Family == redirect.IPv6 && (!a.Is6() || a.Is4In6()):
			return p, fmt.Errorf("address %s is not an %s address", a, p.Family)
		case p.Family != redirect.IPv4 && p.Family != redirect.IPv6:
			return p, fmt.Errorf("unknown family %d", p.Family)
		}
	}
	if p.Proto == "" {
		return p, errors.New("protocol is required")
	}
	switch p.CTState {
	case "":
		p.CTState = CTNew
	case CTNew, redirect.CTEstablished, redirect.CTRelated, redirect.CTInvalid:
	default:
		return p, fmt.Errorf("unknown conntrack state %q", p.CTState)
	}
	if p.Direction == Outbound && (p.OutIface == "" || p.InIface != "") {
		return p, errors.New("an outbound packet has an output interface and no input interface")
	}
	if p.Direction == Inbound && (p.InIface == "" || p.OutIface != "") {
		return p, errors.New("an inbound packet has an input interface and, before routing, no output interface")
	}
	return p, nil
}

// loopedBack reports a packet arriving on lo: it was sent locally and keeps the
// conntrack entry it got in OUTPUT.
func (p Packet) loopedBack() bool { return p.Direction == Inbound && p.InIface == "lo" }

type tracer struct {
	pkt            Packet
	hook           string
	mark, connMark uint32
	// table is the table being walked.
	table redirect.Table
	// ctAttached is set once the packet has conntrack: from a CT target, or, for a
	// packet looped back through lo, from its pass through OUTPUT.
	ctAttached bool
	v          Verdict
}

func (t *tracer) note(table redirect.Table, chain, note string) {
	t.v.Trace = append(t.v.Trace, Step{Table: table, Chain: chain, Note: note})
}

// natSkipped says why the nat table does not see this packet, or "" when it does.
func (t *tracer) natSkipped() string {
	if t.pkt.CTState != CTNew {
		return fmt.Sprintf("not consulted for a %s packet: only a connection's first packet is NATed", t.pkt.CTState)
	}
	if t.pkt.loopedBack() {
		return "not consulted on lo: a loopback connection's NAT was decided at OUTPUT"
	}
	return ""
}

// runTable walks one table from the hook's built-in chain. stop reports that the
// packet left netfilter (dropped).
func (t *tracer) runTable(tp *redirect.TablePlan) (stop bool, err error) {
	chains, err := tp.FinalChains()
	if err != nil {
		return false, err
	}
	t.table = tp.Table
	type frame struct {
		chain string
		next  int
	}
	var stack []frame
	chain, next := t.hook, 0
	for {
		rules := chains[chain]
		if next >= len(rules) {
			if len(stack) == 0 {
				return false, nil // the built-in chain's policy: ACCEPT
			}
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			chain, next = f.chain, f.next
			continue
		}
		r := rules[next]
		next++
		ok, err := t.matches(r.Matches)
		if err != nil {
			return false, fmt.Errorf("chain %s rule %d: %w", chain, next, err)
		}
		if !ok {
			continue
		}
		t.v.Trace = append(t.v.Trace, Step{Table: tp.Table, Chain: chain, Index: next, Rule: r})
		tg := r.Target
		switch tg.Kind {
		case redirect.TargetJump:
			if redirect.IsBuiltin(tg.Chain) || !slices.Contains(tp.Chains, tg.Chain) {
				return false, fmt.Errorf("chain %s rule %d: jump to %s, which is not a chain of this table", chain, next, tg.Chain)
			}
			if len(stack) >= maxJumpDepth {
				return false, fmt.Errorf("chain %s rule %d: jumps nest deeper than %d: a loop", chain, next, maxJumpDepth)
			}
			stack = append(stack, frame{chain, next})
			chain, next = tg.Chain, 0
		case redirect.TargetReturn:
			if len(stack) == 0 {
				return false, nil // RETURN from a built-in chain applies its policy: ACCEPT
			}
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			chain, next = f.chain, f.next
		case redirect.TargetAccept:
			return false, nil
		case redirect.TargetDrop:
			t.v.Action, t.v.Port = Dropped, 0
			return true, nil
		case redirect.TargetRedirect:
			if tp.Table != redirect.TableNAT {
				return false, fmt.Errorf("chain %s rule %d: REDIRECT outside the nat table", chain, next)
			}
			if t.v.Action == TProxied {
				t.note(tp.Table, chain, "REDIRECT after TPROXY: the socket TPROXY assigned still receives the packet")
				return false, nil
			}
			t.v.Action, t.v.Port = Redirected, tg.Port
			return false, nil
		case redirect.TargetTProxy:
			if tp.Table != redirect.TableMangle || t.hook != redirect.ChainPrerouting {
				return false, fmt.Errorf("chain %s rule %d: TPROXY outside mangle PREROUTING", chain, next)
			}
			if t.pkt.Proto != redirect.TCP && t.pkt.Proto != redirect.UDP {
				return false, fmt.Errorf("chain %s rule %d: TPROXY of a %s packet", chain, next, t.pkt.Proto)
			}
			t.mark = tg.Mark // --tproxy-mark value/0xffffffff
			t.v.Action, t.v.Port = TProxied, tg.Port
			return false, nil
		case redirect.TargetSetMark:
			t.mark = tg.Mark // --set-mark is --set-xmark value/0xffffffff
		case redirect.TargetSaveMark:
			t.connMark = t.mark
		case redirect.TargetRestoreMark:
			t.mark = t.connMark
		case redirect.TargetCTZone:
			if tp.Table != redirect.TableRaw {
				return false, fmt.Errorf("chain %s rule %d: CT outside the raw table", chain, next)
			}
			// xt_CT does nothing to a packet that already has conntrack attached:
			// the first CT rule that matches decides the zone.
			if t.ctAttached {
				t.note(tp.Table, chain, fmt.Sprintf("CT --zone %d ignored: the packet already has conntrack", tg.Zone))
				continue
			}
			t.ctAttached, t.v.Zone = true, tg.Zone
		default:
			return false, fmt.Errorf("chain %s rule %d: unknown target kind %d", chain, next, tg.Kind)
		}
	}
}

// matches reports whether every match holds, evaluated in order as the kernel does.
func (t *tracer) matches(ms []redirect.Match) (bool, error) {
	for _, m := range ms {
		ok, err := t.match(m)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func (t *tracer) match(m redirect.Match) (bool, error) {
	p := t.pkt
	var hit bool
	switch m.Kind {
	case redirect.MatchProtocol:
		hit = p.Proto == m.Proto
	case redirect.MatchInIface:
		// Locally generated packets have no input interface.
		hit = ifaceMatches(m.Iface, p.InIface)
	case redirect.MatchOutIface:
		// Before routing, an arriving packet has no output interface.
		hit = ifaceMatches(m.Iface, p.OutIface)
	case redirect.MatchSource, redirect.MatchDest:
		if !m.Prefix.IsValid() {
			return false, errors.New("address match without an address")
		}
		if m.Prefix.Addr().Is4() != (p.Family == redirect.IPv4) {
			return false, fmt.Errorf("%s address match %s in the %s family", familyOf(m.Prefix.Addr()), m.Prefix, p.Family)
		}
		a := p.Dst
		if m.Kind == redirect.MatchSource {
			a = p.Src
		}
		hit = m.Prefix.Contains(a)
	case redirect.MatchDestPort, redirect.MatchSourcePort:
		if len(m.Ports) == 0 {
			return false, errors.New("port match with no ports")
		}
		if p.Proto != redirect.TCP && p.Proto != redirect.UDP {
			return false, fmt.Errorf("port match on a %s packet", p.Proto)
		}
		port := p.DstPort
		if m.Kind == redirect.MatchSourcePort {
			port = p.SrcPort
		}
		hit = slices.Contains(m.Ports, port)
	case redirect.MatchUIDOwner, redirect.MatchGIDOwner:
		if t.hook != redirect.ChainOutput {
			return false, fmt.Errorf("owner match in %s: xt_owner works only on locally generated packets", t.hook)
		}
		if p.NoSocket {
			// xt_owner without a socket: only inverted criteria hold.
			return m.Negate, nil
		}
		var err error
		hit, err = ownerMatches(m, p)
		if err != nil {
			return false, err
		}
	case redirect.MatchMark:
		hit = t.mark == m.Mark
	case redirect.MatchConnMark:
		hit = t.connMark == m.Mark
	case redirect.MatchCTState:
		if len(m.CTStates) == 0 {
			return false, errors.New("conntrack state match with no states")
		}
		state := p.CTState
		if t.table == redirect.TableRaw && !p.loopedBack() {
			// The raw table runs before conntrack: a packet there has no state yet,
			// which the conntrack match reports as INVALID.
			state = redirect.CTInvalid
		}
		hit = slices.Contains(m.CTStates, state)
	default:
		return false, fmt.Errorf("unknown match kind %d", m.Kind)
	}
	return hit != m.Negate, nil
}

func familyOf(a netip.Addr) redirect.Family {
	if a.Is4() {
		return redirect.IPv4
	}
	return redirect.IPv6
}

// ifaceMatches is iptables' interface comparison: exact, or a prefix with a '+' suffix.
// An empty packet interface (none) matches no name.
func ifaceMatches(pattern, iface string) bool {
	if iface == "" {
		return false
	}
	if prefix, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, prefix)
	}
	return pattern == iface
}

// ownerMatches evaluates --uid-owner or --gid-owner (not negated) against the socket's
// fsuid/fsgid. Ids may be ranges ("1000-2000"); group names compare with GroupName.
func ownerMatches(m redirect.Match, p Packet) (bool, error) {
	id := p.UID
	if m.Kind == redirect.MatchGIDOwner {
		id = p.GID
	}
	lo, hi, numeric, err := parseOwnerRange(m.Owner)
	if err != nil {
		return false, err
	}
	if numeric {
		return lo <= id && id <= hi, nil
	}
	if m.Kind == redirect.MatchUIDOwner {
		return false, fmt.Errorf("uid owner %q: the tracer does not resolve user names", m.Owner)
	}
	return p.GroupName != "" && p.GroupName == m.Owner, nil
}

// parseOwnerRange parses "1337", "1000-2000" or "1000:2000" as iptables does, but in
// decimal only. numeric is false for a name.
func parseOwnerRange(s string) (lo, hi uint32, numeric bool, err error) {
	if s == "" {
		return 0, 0, false, errors.New("owner match without an owner")
	}
	sep := "-"
	if strings.Contains(s, ":") {
		sep = ":" // iptables takes either
	}
	first, last, isRange := strings.Cut(s, sep)
	if !isDigits(first) || isRange && !isDigits(last) {
		if isDigits(first) {
			return 0, 0, false, fmt.Errorf("owner %q is not an id or id range", s)
		}
		return 0, 0, false, nil
	}
	for _, part := range []string{first, last} {
		if len(part) > 1 && part[0] == '0' {
			// iptables would read it as octal; nothing else would.
			return 0, 0, false, fmt.Errorf("owner %q has a leading zero, which iptables reads as octal", s)
		}
	}
	a, err := strconv.ParseUint(first, 10, 32)
	if err != nil {
		return 0, 0, false, fmt.Errorf("owner %q is not an id or id range", s)
	}
	b := a
	if isRange {
		if b, err = strconv.ParseUint(last, 10, 32); err != nil || b < a {
			return 0, 0, false, fmt.Errorf("owner %q is not an id or id range", s)
		}
	}
	if b == redirect.InvalidID {
		return 0, 0, false, fmt.Errorf("owner %q includes (uid_t)-1, which iptables refuses", s)
	}
	return uint32(a), uint32(b), true, nil
}

// formatRule writes a rule in iptables' words, for traces.
func formatRule(r redirect.Rule) string {
	var parts []string
	not := func(m redirect.Match, s string) string {
		if m.Negate {
			return "! " + s
		}
		return s
	}
	ports := func(ps []uint16) string {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = strconv.Itoa(int(p))
		}
		return strings.Join(s, ",")
	}
	for _, m := range r.Matches {
		switch m.Kind {
		case redirect.MatchProtocol:
			parts = append(parts, not(m, "-p "+string(m.Proto)))
		case redirect.MatchInIface:
			parts = append(parts, not(m, "-i "+m.Iface))
		case redirect.MatchOutIface:
			parts = append(parts, not(m, "-o "+m.Iface))
		case redirect.MatchSource:
			parts = append(parts, not(m, "-s "+m.Prefix.String()))
		case redirect.MatchDest:
			parts = append(parts, not(m, "-d "+m.Prefix.String()))
		case redirect.MatchDestPort:
			parts = append(parts, not(m, "--dport "+ports(m.Ports)))
		case redirect.MatchSourcePort:
			parts = append(parts, not(m, "--sport "+ports(m.Ports)))
		case redirect.MatchUIDOwner:
			parts = append(parts, not(m, "--uid-owner "+m.Owner))
		case redirect.MatchGIDOwner:
			parts = append(parts, not(m, "--gid-owner "+m.Owner))
		case redirect.MatchMark:
			parts = append(parts, not(m, fmt.Sprintf("--mark %d", m.Mark)))
		case redirect.MatchConnMark:
			parts = append(parts, not(m, fmt.Sprintf("--connmark %d", m.Mark)))
		case redirect.MatchCTState:
			s := make([]string, len(m.CTStates))
			for i, st := range m.CTStates {
				s[i] = string(st)
			}
			parts = append(parts, not(m, "--ctstate "+strings.Join(s, ",")))
		default:
			parts = append(parts, fmt.Sprintf("match(%d)", m.Kind))
		}
	}
	tg := r.Target
	switch tg.Kind {
	case redirect.TargetJump:
		parts = append(parts, "-j "+tg.Chain)
	case redirect.TargetReturn:
		parts = append(parts, "-j RETURN")
	case redirect.TargetAccept:
		parts = append(parts, "-j ACCEPT")
	case redirect.TargetDrop:
		parts = append(parts, "-j DROP")
	case redirect.TargetRedirect:
		parts = append(parts, fmt.Sprintf("-j REDIRECT --to-ports %d", tg.Port))
	case redirect.TargetTProxy:
		parts = append(parts, fmt.Sprintf("-j TPROXY --tproxy-mark %d --on-port %d", tg.Mark, tg.Port))
	case redirect.TargetSetMark:
		parts = append(parts, fmt.Sprintf("-j MARK --set-mark %d", tg.Mark))
	case redirect.TargetSaveMark:
		parts = append(parts, "-j CONNMARK --save-mark")
	case redirect.TargetRestoreMark:
		parts = append(parts, "-j CONNMARK --restore-mark")
	case redirect.TargetCTZone:
		parts = append(parts, fmt.Sprintf("-j CT --zone %d", tg.Zone))
	default:
		parts = append(parts, fmt.Sprintf("target(%d)", tg.Kind))
	}
	return strings.Join(parts, " ")
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
