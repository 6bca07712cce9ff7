package trace

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Hand-built plans pin the tracer's netfilter semantics independently of the builder.

func handPlan(tables ...redirect.TablePlan) *redirect.Plan {
	return &redirect.Plan{Families: []redirect.FamilyPlan{{Family: redirect.IPv4, Tables: tables}, {Family: redirect.IPv6, Tables: tables}}}
}

func table(t redirect.Table, chains []string, rules ...redirect.Rule) redirect.TablePlan {
	return redirect.TablePlan{Table: t, Chains: chains, Rules: rules}
}

func rule(chain string, target redirect.Target, matches ...redirect.Match) redirect.Rule {
	return redirect.Rule{Chain: chain, Target: target, Matches: matches}
}

// TestTraceMatchSemantics checks every match kind, plain and negated, against the
// kernel's meaning. A rule that matches redirects to port 1.
func TestTraceMatchSemantics(t *testing.T) {
	tcp := proto(redirect.TCP)
	neg := func(m redirect.Match) redirect.Match { m.Negate = true; return m }
	pfx := netip.MustParsePrefix
	tests := []struct {
		name    string
		matches []redirect.Match
		pkt     Packet
		want    bool
	}{
		{"protocol matches", []redirect.Match{tcp}, out(appUID, "10.0.0.5", 80), true},
		{"protocol differs", []redirect.Match{tcp}, out(appUID, "10.0.0.5", 80, withUDP), false},
		{"negated protocol", []redirect.Match{neg(tcp)}, out(appUID, "10.0.0.5", 80, withUDP), true},

		{"single dport matches", []redirect.Match{tcp, dport(80)}, out(appUID, "10.0.0.5", 80), true},
		{"single dport differs", []redirect.Match{tcp, dport(80)}, out(appUID, "10.0.0.5", 81), false},
		{"negated single dport", []redirect.Match{tcp, notDport(80)}, out(appUID, "10.0.0.5", 81), true},
		{"multiport: first port", []redirect.Match{tcp, dport(53, 15008)}, out(appUID, "10.0.0.5", 53), true},
		{"multiport: last port", []redirect.Match{tcp, dport(53, 15008)}, out(appUID, "10.0.0.5", 15008), true},
		{"multiport: other port", []redirect.Match{tcp, dport(53, 15008)}, out(appUID, "10.0.0.5", 80), false},
		{"negated multiport: other port", []redirect.Match{tcp, notDport(53, 15008)}, out(appUID, "10.0.0.5", 80), true},
		{"negated multiport: listed port", []redirect.Match{tcp, notDport(53, 15008)}, out(appUID, "10.0.0.5", 15008), false},
		{"sport matches the source port", []redirect.Match{tcp, sport(40000)}, out(appUID, "10.0.0.5", 80), true},
		{"sport does not look at the destination port", []redirect.Match{tcp, sport(80)}, out(appUID, "10.0.0.5", 80), false},
		{"negated multi sport", []redirect.Match{tcp, neg(redirect.Match{Kind: redirect.MatchSourcePort, Ports: []uint16{1, 2}})}, out(appUID, "10.0.0.5", 80), true},

		{"dest inside prefix", []redirect.Match{dst(pfx("10.0.0.0/24"))}, out(appUID, "10.0.0.255", 80), true},
		{"dest outside prefix", []redirect.Match{dst(pfx("10.0.0.0/24"))}, out(appUID, "10.0.1.0", 80), false},
		{"unmasked prefix is masked: 127.0.0.1/8 holds 127.9.9.9", []redirect.Match{dst(pfx("127.0.0.1/8"))}, out(appUID, "127.9.9.9", 80), true},
		{"unmasked prefix is masked: 127.0.0.1/8 lacks 128.0.0.1", []redirect.Match{dst(pfx("127.0.0.1/8"))}, out(appUID, "128.0.0.1", 80), false},
		{"host prefix is exact", []redirect.Match{dst(pfx("127.0.0.1/32"))}, out(appUID, "127.0.0.2", 80), false},
		{"negated dest", []redirect.Match{notDst(pfx("127.0.0.1/32"))}, out(appUID, "127.0.0.2", 80), true},
		{"source prefix", []redirect.Match{src(pfx("127.0.0.6/32"))}, out(appUID, "10.0.0.9", 80, withSrc("127.0.0.6")), true},
		{"source prefix does not look at the destination", []redirect.Match{src(pfx("10.0.0.5/32"))}, out(appUID, "10.0.0.5", 80), false},
		{"IPv6 prefix", []redirect.Match{dst(pfx("fd00::/64"))}, out(appUID, "fd00::5", 80), true},
		{"IPv6 prefix outside", []redirect.Match{dst(pfx("fd00::/64"))}, out(appUID, "fd00:0:0:1::5", 80), false},

		{"out interface matches", []redirect.Match{outIface("lo")}, out(appUID, "127.0.0.1", 80), true},
		{"out interface differs", []redirect.Match{outIface("lo")}, out(appUID, "10.0.0.5", 80), false},
		{"negated out interface", []redirect.Match{redirect.Match{Kind: redirect.MatchOutIface, Iface: "lo", Negate: true}}, out(appUID, "10.0.0.5", 80), true},
		{"outbound packet has no in interface", []redirect.Match{inIface("eth0")}, out(appUID, "10.0.0.5", 80), false},
		{"negated in interface holds for an outbound packet", []redirect.Match{redirect.Match{Kind: redirect.MatchInIface, Iface: "eth0", Negate: true}}, out(appUID, "10.0.0.5", 80), true},
		{"in interface matches", []redirect.Match{inIface("eth0")}, in("10.1.1.1", 80), true},
		{"inbound packet has no out interface before routing", []redirect.Match{outIface("eth0")}, in("10.1.1.1", 80), false},
		{"negated out interface holds for an inbound packet", []redirect.Match{redirect.Match{Kind: redirect.MatchOutIface, Iface: "eth0", Negate: true}}, in("10.1.1.1", 80), true},
		{"interface wildcard matches a prefix", []redirect.Match{inIface("eth+")}, in("10.1.1.1", 80, withIface("eth12")), true},
		{"interface wildcard is a prefix, not a substring", []redirect.Match{inIface("eth+")}, in("10.1.1.1", 80, withIface("veth0")), false},
		{"interface name without wildcard is exact", []redirect.Match{inIface("eth")}, in("10.1.1.1", 80, withIface("eth0")), false},

		{"uid owner matches", []redirect.Match{uidOwner(1337)}, out(proxyUID, "10.0.0.5", 80), true},
		{"uid owner differs", []redirect.Match{uidOwner(1337)}, out(appUID, "10.0.0.5", 80), false},
		{"negated uid owner", []redirect.Match{notUIDOwner(1337)}, out(appUID, "10.0.0.5", 80), true},
		{"uid owner range", []redirect.Match{{Kind: redirect.MatchUIDOwner, Owner: "1000-1999"}}, out(1999, "10.0.0.5", 80), true},
		{"uid owner range excludes the next id", []redirect.Match{{Kind: redirect.MatchUIDOwner, Owner: "1000-1999"}}, out(2000, "10.0.0.5", 80), false},
		{"uid owner range with a colon", []redirect.Match{{Kind: redirect.MatchUIDOwner, Owner: "1000:1999"}}, out(1000, "10.0.0.5", 80), true},
		{"uid owner is not the gid", []redirect.Match{uidOwner(7)}, out(appUID, "10.0.0.5", 80, withGroup(7, "")), false},
		{"gid owner matches the fsgid", []redirect.Match{gidOwner("7")}, out(appUID, "10.0.0.5", 80, withGroup(7, "")), true},
		{"gid owner ignores supplementary groups", []redirect.Match{gidOwner("7")}, out(appUID, "10.0.0.5", 80, withGroups("7")), false},
		{"gid owner name matches the group's name", []redirect.Match{gidOwner("java")}, out(appUID, "10.0.0.5", 80, withGroup(2001, "java")), true},
		{"gid owner name ignores supplementary names", []redirect.Match{gidOwner("java")}, out(appUID, "10.0.0.5", 80, withGroups("java")), false},
		{"negated gid owner name", []redirect.Match{notGIDOwner("java")}, out(appUID, "10.0.0.5", 80, withGroup(2001, "ftp")), true},
		{"negated gid owner of the fsgid", []redirect.Match{notGIDOwner("7")}, out(appUID, "10.0.0.5", 80, withGroup(7, "")), false},
		{"no socket: uid owner does not hold", []redirect.Match{uidOwner(0)}, out(0, "10.0.0.5", 80, func(p *Packet) { p.NoSocket = true }), false},
		{"no socket: negated uid owner holds", []redirect.Match{notUIDOwner(0)}, out(0, "10.0.0.5", 80, func(p *Packet) { p.NoSocket = true }), true},
		{"no socket: negated gid owner holds", []redirect.Match{notGIDOwner("0")}, out(0, "10.0.0.5", 80, func(p *Packet) { p.NoSocket = true }), true},

		{"mark matches", []redirect.Match{mark(1337)}, out(appUID, "10.0.0.5", 80, withMark(1337)), true},
		{"mark is exact", []redirect.Match{mark(1337)}, out(appUID, "10.0.0.5", 80, withMark(1337|0x10000)), false},
		{"negated mark", []redirect.Match{notMark(1338)}, out(appUID, "10.0.0.5", 80, withMark(1337)), true},
		{"connmark looks at the connection", []redirect.Match{connMark(1337)}, out(appUID, "10.0.0.5", 80, withConnMark(1337)), true},
		{"connmark does not look at the packet mark", []redirect.Match{connMark(1337)}, out(appUID, "10.0.0.5", 80, withMark(1337)), false},

		{"conntrack state in the list", []redirect.Match{ctState(redirect.CTRelated, redirect.CTEstablished)}, in("10.1.1.1", 80, withState(redirect.CTEstablished)), true},
		{"conntrack state NEW by default", []redirect.Match{ctState(redirect.CTRelated, redirect.CTEstablished)}, in("10.1.1.1", 80), false},
		{"negated conntrack state", []redirect.Match{{Kind: redirect.MatchCTState, CTStates: []redirect.CTState{redirect.CTInvalid}, Negate: true}}, in("10.1.1.1", 80), true},

		{"every match must hold", []redirect.Match{tcp, dport(80), outIface("eth0")}, out(appUID, "10.0.0.5", 80, withIface("eth1")), false},
		{"no matches always holds", nil, out(appUID, "10.0.0.5", 80), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hook := redirect.ChainOutput
			if tt.pkt.Direction == Inbound {
				hook = redirect.ChainPrerouting
			}
			// A mangle rule that drops proves the match held: mangle sees every packet.
			p := handPlan(table(redirect.TableMangle, []string{redirect.ChainDrop},
				rule(hook, jump(redirect.ChainDrop), tt.matches...), rule(redirect.ChainDrop, drop)))
			v, err := Trace(p, tt.pkt)
			if err != nil {
				t.Fatalf("Trace(%s): %v", tt.pkt, err)
			}
			if got := v.Action == Dropped; got != tt.want {
				t.Errorf("%s matched %v, want %v\n%s", tt.pkt, got, tt.want, v)
			}
		})
	}
}

// TestTraceWalksTablesAsNetfilter checks hooks, table order, jumps and targets.
func TestTraceWalksTablesAsNetfilter(t *testing.T) {
	const a, b = "ISTIO_A", "ISTIO_B"
	tests := []struct {
		name string
		plan *redirect.Plan
		pkt  Packet
		want Verdict
	}{
		{"RETURN in a built-in chain ends the table with ACCEPT", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, ret), rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)))),
			out(appUID, "10.0.0.5", 80), passed()},
		{"RETURN in our chain goes back to the caller", handPlan(
			table(redirect.TableNAT, []string{a}, rule(redirect.ChainOutput, jump(a)), rule(redirect.ChainOutput, redirectTo(2), proto(redirect.TCP)),
				rule(a, ret), rule(a, redirectTo(1), proto(redirect.TCP)))),
			out(appUID, "10.0.0.5", 80), redirected(2)},
		{"falling off our chain goes back to the caller", handPlan(
			table(redirect.TableNAT, []string{a, b}, rule(redirect.ChainOutput, jump(a)), rule(redirect.ChainOutput, redirectTo(2), proto(redirect.TCP)),
				rule(a, jump(b)), rule(b, setMark(9)))),
			out(appUID, "10.0.0.5", 80), redirected(2).marked(9)},
		{"ACCEPT in our chain ends the table but not the hook", handPlan(
			table(redirect.TableMangle, []string{a}, rule(redirect.ChainOutput, jump(a)), rule(redirect.ChainOutput, setMark(6)),
				rule(a, setMark(5)), rule(a, accept)),
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(9), proto(redirect.TCP), mark(5)))),
			out(appUID, "10.0.0.5", 80), redirected(9).marked(5)},
		{"tables run raw, then mangle, then nat", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(9), proto(redirect.TCP), mark(4))),
			table(redirect.TableMangle, nil, rule(redirect.ChainOutput, setMark(4), mark(3))),
			table(redirect.TableRaw, nil, rule(redirect.ChainOutput, setMark(3)))),
			out(appUID, "10.0.0.5", 80), redirected(9).marked(4)},
		{"outbound packets use OUTPUT, not PREROUTING", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainPrerouting, redirectTo(1), proto(redirect.TCP)))),
			out(appUID, "10.0.0.5", 80), passed()},
		{"inbound packets use PREROUTING, not OUTPUT", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)))),
			in("10.1.1.1", 80), passed()},
		{"the filter table sees outbound packets last", handPlan(
			table(redirect.TableFilter, nil, rule(redirect.ChainOutput, drop, mark(8))),
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, setMark(8)))),
			out(appUID, "10.0.0.5", 80), dropped().marked(8)},
		{"DROP ends every table", handPlan(
			table(redirect.TableMangle, nil, rule(redirect.ChainPrerouting, drop)),
			table(redirect.TableNAT, nil, rule(redirect.ChainPrerouting, redirectTo(1), proto(redirect.TCP)))),
			in("10.1.1.1", 80), dropped()},
		{"REDIRECT ends the nat table", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)), rule(redirect.ChainOutput, setMark(1)))),
			out(appUID, "10.0.0.5", 80), redirected(1)},
		{"TPROXY marks the packet and ends the mangle table", handPlan(
			table(redirect.TableMangle, nil, rule(redirect.ChainPrerouting, tproxy(15006, 1337), proto(redirect.TCP)), rule(redirect.ChainPrerouting, setMark(1)))),
			in("10.1.1.1", 80), tproxied(15006, 1337)},
		{"the first CT target decides the zone", handPlan(
			table(redirect.TableRaw, nil, rule(redirect.ChainOutput, ctZone(1)), rule(redirect.ChainOutput, ctZone(2)))),
			out(appUID, "10.0.0.5", 80), passed().zone(1)},
		{"CT --zone 0 also attaches conntrack", handPlan(
			table(redirect.TableRaw, nil, rule(redirect.ChainOutput, ctZone(0)), rule(redirect.ChainOutput, ctZone(2)))),
			out(appUID, "10.0.0.5", 80), passed()},
		{"the raw table runs before conntrack: every state reads INVALID", handPlan(
			table(redirect.TableRaw, nil, rule(redirect.ChainPrerouting, setMark(1), ctState(redirect.CTInvalid)))),
			in("10.1.1.1", 80, withState(redirect.CTEstablished)), passed().marked(1)},
		{"a packet looped back through lo keeps its conntrack: raw sees its state", handPlan(
			table(redirect.TableRaw, nil, rule(redirect.ChainPrerouting, setMark(1), ctState(redirect.CTInvalid)))),
			in("10.0.0.9", 80, withIface("lo"), withState(redirect.CTEstablished)), passed()},
		{"a packet looped back through lo keeps its zone: CT does nothing", handPlan(
			table(redirect.TableRaw, nil, rule(redirect.ChainPrerouting, ctZone(1)))),
			in("10.0.0.9", 80, withIface("lo")), passed()},
		{"save-mark copies the packet mark to the connection", handPlan(
			table(redirect.TableMangle, nil, rule(redirect.ChainPrerouting, saveMark))),
			in("10.1.1.1", 80, withMark(7), withConnMark(3)), passed().marked(7).connMarked(7)},
		{"restore-mark copies the connection mark to the packet", handPlan(
			table(redirect.TableMangle, nil, rule(redirect.ChainOutput, restoreMark))),
			out(appUID, "10.0.0.5", 80, withMark(7), withConnMark(3)), passed().marked(3).connMarked(3)},
		{"nat does not see RELATED packets", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)))),
			out(appUID, "10.0.0.5", 80, withState(redirect.CTRelated)), passed()},
		{"a family the plan lacks passes", &redirect.Plan{Families: []redirect.FamilyPlan{{Family: redirect.IPv4, Tables: []redirect.TablePlan{
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)))}}}},
			out(appUID, "fd00::5", 80), passed()},
		{"positional inserts are replayed", handPlan(
			table(redirect.TableNAT, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)), redirect.Rule{Chain: redirect.ChainOutput, Position: 1, Target: redirectTo(2), Matches: []redirect.Match{proto(redirect.TCP)}})),
			out(appUID, "10.0.0.5", 80), redirected(2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Trace(tt.plan, tt.pkt)
			if err != nil {
				t.Fatalf("Trace(%s): %v", tt.pkt, err)
			}
			if diff := cmp.Diff(tt.want, got, ignoreTrace); diff != "" {
				t.Errorf("(-want +got):\n%s\n%s", diff, got)
			}
		})
	}
}

// TestTraceRefusesWhatTheKernelWouldNot checks the errors for plans netfilter would
// not load and packets no kernel produces.
func TestTraceRefusesWhatTheKernelWouldNot(t *testing.T) {
	const a = "ISTIO_A"
	good := out(appUID, "10.0.0.5", 80)
	tests := []struct {
		name    string
		plan    *redirect.Plan
		pkt     Packet
		wantErr string
	}{
		{"jump to an undeclared chain", handPlan(table(redirect.TableNAT, nil, rule(redirect.ChainOutput, jump(a)))), good, "not a chain of this table"},
		{"jump to a built-in chain", handPlan(table(redirect.TableNAT, nil, rule(redirect.ChainOutput, jump(redirect.ChainPrerouting)))), good, "not a chain of this table"},
		{"jump loop", handPlan(table(redirect.TableNAT, []string{a}, rule(redirect.ChainOutput, jump(a)), rule(a, jump(a)))), good, "a loop"},
		{"REDIRECT outside nat", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, redirectTo(1), proto(redirect.TCP)))), good, "REDIRECT outside the nat table"},
		{"TPROXY in OUTPUT", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, tproxy(1, 1), proto(redirect.TCP)))), good, "TPROXY outside mangle PREROUTING"},
		{"TPROXY of ICMP", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainPrerouting, tproxy(1, 1)))), in("10.1.1.1", 0, func(p *Packet) { p.Proto = "icmp" }), "TPROXY of a icmp packet"},
		{"CT outside raw", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, ctZone(1)))), good, "CT outside the raw table"},
		{"owner match in PREROUTING", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainPrerouting, accept, uidOwner(1)))), in("10.1.1.1", 80), "owner match in PREROUTING"},
		{"user name owner", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, redirect.Match{Kind: redirect.MatchUIDOwner, Owner: "envoy"}))), good, "does not resolve user names"},
		{"bad owner range", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, redirect.Match{Kind: redirect.MatchGIDOwner, Owner: "9-1"}))), good, `"9-1" is not an id`},
		{"owner (uid_t)-1", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, uidOwner(redirect.InvalidID)))), good, "(uid_t)-1"},
		{"owner with a leading zero", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, gidOwner("010")))), good, "leading zero"},
		{"port match on ICMP", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, dport(1)))), out(appUID, "10.0.0.5", 0, func(p *Packet) { p.Proto = "icmp" }), "port match on a icmp packet"},
		{"IPv6 prefix in IPv4", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, dst(netip.MustParsePrefix("::1/128"))))), good, "ipv6 address match ::1/128 in the ipv4 family"},
		{"filter PREROUTING", handPlan(table(redirect.TableFilter, nil, rule(redirect.ChainPrerouting, accept))), in("10.1.1.1", 80), "filter table has rules in PREROUTING"},
		{"unknown match", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, accept, redirect.Match{Kind: 99}))), good, "unknown match kind 99"},
		{"unknown target", handPlan(table(redirect.TableMangle, nil, rule(redirect.ChainOutput, redirect.Target{Kind: 99}))), good, "unknown target kind 99"},
		{"insert beyond the chain", handPlan(table(redirect.TableMangle, nil, redirect.Rule{Chain: redirect.ChainOutput, Position: 2, Target: accept})), good, "position 2"},

		{"no direction", handPlan(), func() Packet { p := good; p.Direction = 0; return p }(), "direction must be"},
		{"no addresses", handPlan(), Packet{Direction: Outbound, Proto: redirect.TCP, OutIface: "eth0"}, "addresses are required"},
		{"IPv4 family with an IPv6 address", handPlan(), func() Packet { p := good; p.Src = pod6; return p }(), "is not an ipv4 address"},
		{"IPv6 family with a mapped IPv4 address", handPlan(), out(appUID, "fd00::5", 80, withSrc("::ffff:10.0.0.9")), "is not an ipv6 address"},
		{"zoned address", handPlan(), out(appUID, "fe80::1%eth0", 80), "has a zone"},
		{"no protocol", handPlan(), func() Packet { p := good; p.Proto = ""; return p }(), "protocol is required"},
		{"unknown conntrack state", handPlan(), out(appUID, "10.0.0.5", 80, withState("UNTRACKED")), `unknown conntrack state "UNTRACKED"`},
		{"outbound without an output interface", handPlan(), out(appUID, "10.0.0.5", 80, withIface("")), "an outbound packet has an output interface"},
		{"outbound with an input interface", handPlan(), func() Packet { p := good; p.InIface = "eth0"; return p }(), "an outbound packet has an output interface"},
		{"inbound with an output interface", handPlan(), func() Packet { p := in("10.1.1.1", 80); p.OutIface = "eth0"; return p }(), "an inbound packet has an input interface"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Trace(tt.plan, tt.pkt)
			if err == nil {
				t.Fatalf("Trace(%s) = %s, want an error containing %q", tt.pkt, v, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Trace(%s) error %q, want it to contain %q", tt.pkt, err, tt.wantErr)
			}
		})
	}
}
