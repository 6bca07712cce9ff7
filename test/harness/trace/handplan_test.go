package trace

import (
	"fmt"
	"net/netip"

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
func redirectTarget(port uint16) redirect.Target {
	return redirect.Target{Kind: redirect.TargetRedirect, Port: port}
}
func setMark(m uint32) redirect.Target { return redirect.Target{Kind: redirect.TargetSetMark, Mark: m} }
func ctZone(z uint16) redirect.Target  { return redirect.Target{Kind: redirect.TargetCTZone, Zone: z} }
func tproxyTarget(port uint16, m uint32) redirect.Target {
	return redirect.Target{Kind: redirect.TargetTProxy, Port: port, Mark: m}
}

var (
	ret         = redirect.Target{Kind: redirect.TargetReturn}
	accept      = redirect.Target{Kind: redirect.TargetAccept}
	dropTarget  = redirect.Target{Kind: redirect.TargetDrop}
	saveMark    = redirect.Target{Kind: redirect.TargetSaveMark}
	restoreMark = redirect.Target{Kind: redirect.TargetRestoreMark}
)
