package iptables

import (
	"slices"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// istioBuiltinForm says whether r, a rule of a built-in chain of table t, has one
// of the fixed forms that Istio's istio-iptables writes straight into built-in
// chains (where we write only a jump into a chain of ours):
//
//	nat, mangle  PREROUTING  -i IFACE -j RETURN       (excluded and KubeVirt interfaces)
//	nat, mangle  OUTPUT      -o IFACE -j RETURN       (excluded interfaces)
//	mangle  PREROUTING  -p tcp -m mark --mark M -j CONNMARK --save-mark
//	mangle  OUTPUT      -p tcp -o lo -m mark --mark M -j RETURN
//	mangle  OUTPUT      ! -d LOOPBACK -p tcp -o lo -m owner --uid-owner|--gid-owner ID -j MARK --set-mark 1338
//	mangle  OUTPUT      -p tcp -m connmark --mark M -j CONNMARK --restore-mark
//
// The interface, mark, id and loopback range vary with Istio's settings; every
// other part must be exactly so. Nothing else matches: a rule with one more match
// or another target is not Istio's.
func istioBuiltinForm(t redirect.Table, r redirect.Rule) bool {
	if t != redirect.TableNAT && t != redirect.TableMangle {
		return false
	}
	kinds := make([]redirect.MatchKind, len(r.Matches))
	for i, m := range r.Matches {
		kinds[i] = m.Kind
	}
	slices.Sort(kinds)
	find := func(k redirect.MatchKind) redirect.Match {
		for _, m := range r.Matches {
			if m.Kind == k {
				return m
			}
		}
		return redirect.Match{}
	}
	is := func(want ...redirect.MatchKind) bool { return slices.Equal(kinds, want) }
	tcp := func() bool { m := find(redirect.MatchProtocol); return !m.Negate && m.Proto == redirect.TCP }
	outLo := func() bool { m := find(redirect.MatchOutIface); return !m.Negate && m.Iface == "lo" }
	markIs := func(k redirect.MatchKind) bool { m := find(k); return !m.Negate && m.Mark != 0 }

	switch {
	case r.Chain == redirect.ChainPrerouting && r.Target.Kind == redirect.TargetReturn && is(redirect.MatchInIface):
		return !r.Matches[0].Negate
	case r.Chain == redirect.ChainOutput && r.Target.Kind == redirect.TargetReturn && is(redirect.MatchOutIface):
		return !r.Matches[0].Negate
	}
	if t != redirect.TableMangle {
		return false
	}
	switch {
	case r.Chain == redirect.ChainPrerouting && r.Target.Kind == redirect.TargetSaveMark:
		return is(redirect.MatchProtocol, redirect.MatchMark) && tcp() && markIs(redirect.MatchMark)
	case r.Chain == redirect.ChainOutput && r.Target.Kind == redirect.TargetReturn:
		return is(redirect.MatchProtocol, redirect.MatchOutIface, redirect.MatchMark) && tcp() && outLo() && markIs(redirect.MatchMark)
	case r.Chain == redirect.ChainOutput && r.Target.Kind == redirect.TargetRestoreMark:
		return is(redirect.MatchProtocol, redirect.MatchConnMark) && tcp() && markIs(redirect.MatchConnMark)
	case r.Chain == redirect.ChainOutput && r.Target.Kind == redirect.TargetSetMark && r.Target.Mark == redirect.OutboundMark:
		owner := redirect.MatchUIDOwner
		if !is(redirect.MatchProtocol, redirect.MatchOutIface, redirect.MatchDest, owner) {
			owner = redirect.MatchGIDOwner
			if !is(redirect.MatchProtocol, redirect.MatchOutIface, redirect.MatchDest, owner) {
				return false
			}
		}
		d := find(redirect.MatchDest)
		return tcp() && outLo() && !find(owner).Negate && d.Negate && d.Prefix.Addr().IsLoopback()
	}
	return false
}
