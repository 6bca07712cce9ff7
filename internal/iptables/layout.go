package iptables

import (
	"cmp"
	"fmt"
	"os/user"
	"reflect"
	"slices"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// HookChainPrefix names the chains that hold a plan's rules for a built-in chain when
// they cannot be a single jump: ISTIO_HOOK_PREROUTING, ISTIO_HOOK_OUTPUT.
const HookChainPrefix = "ISTIO_HOOK_"

// tableLayout is how one table of a plan is laid out in the kernel. Istio puts some
// rules straight into built-in chains; we own only our chains plus exactly one rule
// per built-in chain, a jump into ours, so that apply, verify and cleanup can tell our
// rules from anyone else's. A RETURN that Istio writes into a built-in chain keeps its
// meaning in a hook chain: it ends our processing of the hook.
type tableLayout struct {
	Table redirect.Table
	// Chains are our chains in creation order (the plan's, then hook chains).
	Chains []string
	// Rules are each of our chains' final rules.
	Rules map[string][]redirect.Rule
	// Hooks is the single rule we own in each built-in chain, keyed by that chain.
	Hooks map[string]redirect.Rule
}

// layout computes the kernel layout of one family's plan.
func layout(fp *redirect.FamilyPlan) ([]tableLayout, error) {
	var out []tableLayout
	for _, tp := range fp.Tables {
		final, err := tp.FinalChains()
		if err != nil {
			return nil, err
		}
		tl := tableLayout{Table: tp.Table, Chains: slices.Clone(tp.Chains), Rules: map[string][]redirect.Rule{}, Hooks: map[string]redirect.Rule{}}
		for _, c := range tp.Chains {
			tl.Rules[c] = final[c]
		}
		for _, builtin := range []string{redirect.ChainPrerouting, redirect.ChainOutput} {
			rules := final[builtin]
			switch {
			case len(rules) == 0:
			case len(rules) == 1 && rules[0].Target.Kind == redirect.TargetJump:
				tl.Hooks[builtin] = rules[0]
			default:
				hook := HookChainPrefix + builtin
				tl.Chains = append(tl.Chains, hook)
				for _, r := range rules {
					r.Chain = hook
					tl.Rules[hook] = append(tl.Rules[hook], r)
				}
				tl.Hooks[builtin] = redirect.Rule{Chain: builtin, Target: redirect.Target{Kind: redirect.TargetJump, Chain: hook}}
			}
		}
		for builtin, r := range tl.Hooks {
			r.Chain = builtin
			tl.Hooks[builtin] = r
		}
		out = append(out, tl)
	}
	return out, nil
}

// liveTable is what of ours a table holds now, read from iptables-save.
type liveTable struct {
	Chains []string
	// Lines are our chains' rule lines, in order.
	Lines map[string][]DumpLine
	// HookLines are the lines in built-in chains that jump into one of our chains.
	HookLines []DumpLine
	// IstioLines are the lines in built-in chains that have one of the fixed forms
	// Istio's own layout writes there (istioBuiltinForm), in a family that holds
	// chains of ours: left by Istio's istio-iptables or CNI, they are removed with
	// ours. Our own layout never writes them: a built-in chain holds only our jumps.
	IstioLines []DumpLine
}

// isOurs says whether a chain name belongs to this project (and to Istio).
func isOurs(chain string) bool { return strings.HasPrefix(chain, redirect.ChainPrefix) }

// jumpTarget returns the -j/-g target of a rule line.
func jumpTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "--jump" || args[i] == "-g" || args[i] == "--goto" {
			return args[i+1]
		}
	}
	return ""
}

// ours extracts our part of a dump, per table.
func ours(d *Dump) map[redirect.Table]*liveTable {
	out := map[redirect.Table]*liveTable{}
	// Istio's fixed forms count as ours only where Istio (or we) programmed the
	// family: without a chain of ours, an "-i eth1 -j RETURN" is someone else's.
	programmed := false
	for _, t := range d.Tables {
		programmed = programmed || slices.ContainsFunc(t.Chains, isOurs)
	}
	for name, t := range d.Tables {
		lt := &liveTable{Lines: map[string][]DumpLine{}}
		for _, c := range t.Chains {
			if isOurs(c) {
				lt.Chains = append(lt.Chains, c)
			}
		}
		for _, l := range t.Lines {
			switch {
			case isOurs(l.Chain):
				lt.Lines[l.Chain] = append(lt.Lines[l.Chain], l)
			case redirect.IsBuiltin(l.Chain) && isOurs(jumpTarget(l.Args)):
				lt.HookLines = append(lt.HookLines, l)
			case programmed && redirect.IsBuiltin(l.Chain):
				if r, err := ParseRuleArgs(l.Chain, l.Args); err == nil && istioBuiltinForm(name, r) {
					lt.IstioLines = append(lt.IstioLines, l)
				}
			}
		}
		if len(lt.Chains) > 0 || len(lt.HookLines) > 0 || len(lt.IstioLines) > 0 {
			out[name] = lt
		}
	}
	return out
}

// normalize puts a rule into the form iptables-save reads it back in: matches in a
// fixed order, prefixes masked, group names as numeric ids.
func normalize(r redirect.Rule) redirect.Rule {
	ms := slices.Clone(r.Matches)
	for i := range ms {
		ms[i].Prefix = ms[i].Prefix.Masked()
		if ms[i].Kind == redirect.MatchGIDOwner {
			if g, err := user.LookupGroup(ms[i].Owner); err == nil {
				ms[i].Owner = g.Gid
			}
		}
	}
	slices.SortStableFunc(ms, func(a, b redirect.Match) int { return cmp.Compare(a.Kind, b.Kind) })
	r.Matches = ms
	r.Position = 0
	return r
}

func ruleText(r redirect.Rule) string { return strings.Join(RuleArgs(r), " ") }

// diffTables lists, in words, how the live state differs from the layout. Tables the
// layout does not use must hold nothing of ours.
func diffTables(family redirect.Family, want []tableLayout, live map[redirect.Table]*liveTable) []string {
	var diffs []string
	say := func(format string, args ...any) {
		diffs = append(diffs, fmt.Sprintf("%s: ", family)+fmt.Sprintf(format, args...))
	}
	wanted := map[redirect.Table]bool{}
	for _, tl := range want {
		wanted[tl.Table] = true
		lt := live[tl.Table]
		if lt == nil {
			lt = &liveTable{Lines: map[string][]DumpLine{}}
		}
		for _, c := range tl.Chains {
			if !slices.Contains(lt.Chains, c) {
				say("table %s: chain %s is missing", tl.Table, c)
				continue
			}
			diffs = append(diffs, diffRules(family, tl.Table, c, tl.Rules[c], lt.Lines[c])...)
		}
		for _, c := range lt.Chains {
			if !slices.Contains(tl.Chains, c) {
				say("table %s: unexpected chain %s", tl.Table, c)
			}
		}
		var hooks []redirect.Rule
		for _, b := range []string{redirect.ChainPrerouting, redirect.ChainOutput} {
			if r, ok := tl.Hooks[b]; ok {
				hooks = append(hooks, r)
			}
		}
		var liveHooks []redirect.Rule
		for _, l := range lt.HookLines {
			r, err := ParseRuleArgs(l.Chain, l.Args)
			if err != nil {
				say("table %s: unreadable rule in %s: %v", tl.Table, l.Chain, err)
				continue
			}
			liveHooks = append(liveHooks, r)
		}
		for _, h := range hooks {
			if !slices.ContainsFunc(liveHooks, func(r redirect.Rule) bool { return rulesEqual(h, r) }) {
				say("table %s: hook rule missing: -A %s %s", tl.Table, h.Chain, ruleText(h))
			}
		}
		for _, r := range liveHooks {
			if !slices.ContainsFunc(hooks, func(h redirect.Rule) bool { return rulesEqual(h, r) }) {
				say("table %s: unexpected hook rule: -A %s %s", tl.Table, r.Chain, ruleText(r))
			}
		}
	}
	for name, lt := range live {
		if !wanted[name] {
			for _, c := range lt.Chains {
				say("table %s: unexpected chain %s", name, c)
			}
			for _, l := range lt.HookLines {
				say("table %s: unexpected hook rule: -A %s %s", name, l.Chain, strings.Join(l.Args, " "))
			}
		}
	}
	slices.Sort(diffs)
	return diffs
}

func rulesEqual(a, b redirect.Rule) bool {
	na, nb := normalize(a), normalize(b)
	if na.Chain != nb.Chain || na.Target != nb.Target || len(na.Matches) != len(nb.Matches) {
		return false
	}
	for i := range na.Matches {
		x, y := na.Matches[i], nb.Matches[i]
		if x.Kind != y.Kind || x.Negate != y.Negate || x.Proto != y.Proto || x.Iface != y.Iface || x.Prefix != y.Prefix ||
			x.Owner != y.Owner || x.Mark != y.Mark || !slices.Equal(x.Ports, y.Ports) || !slices.Equal(x.CTStates, y.CTStates) {
			return false
		}
	}
	return true
}

func diffRules(family redirect.Family, table redirect.Table, chain string, want []redirect.Rule, live []DumpLine) []string {
	var diffs []string
	say := func(format string, args ...any) {
		diffs = append(diffs, fmt.Sprintf("%s: table %s chain %s: ", family, table, chain)+fmt.Sprintf(format, args...))
	}
	for i := 0; i < max(len(want), len(live)); i++ {
		switch {
		case i >= len(live):
			say("rule %d missing: %s", i+1, ruleText(want[i]))
		case i >= len(want):
			say("unexpected rule %d: %s", i+1, strings.Join(live[i].Args, " "))
		default:
			got, err := ParseRuleArgs(chain, live[i].Args)
			if err != nil {
				say("rule %d unreadable (%v): %s", i+1, err, strings.Join(live[i].Args, " "))
			} else if w := want[i]; !rulesEqual(w, got) {
				say("rule %d differs: want %s, have %s", i+1, ruleText(w), strings.Join(live[i].Args, " "))
			}
		}
	}
	return diffs
}

// restoreText builds the one iptables-restore --noflush input that turns the live
// state into the layout (want may be nil: remove everything of ours). Our chains are
// declared, which creates or flushes them; our old hook rules are deleted by their
// exact text; stale chains of ours are deleted after being flushed.
func restoreText(want []tableLayout, live map[redirect.Table]*liveTable) string {
	var b strings.Builder
	byTable := map[redirect.Table]*tableLayout{}
	for i := range want {
		byTable[want[i].Table] = &want[i]
	}
	for _, t := range redirect.TableOrder {
		tl, lt := byTable[t], live[t]
		if tl == nil && lt == nil {
			continue
		}
		if lt == nil {
			lt = &liveTable{}
		}
		if tl == nil {
			tl = &tableLayout{Table: t}
		}
		fmt.Fprintf(&b, "*%s\n", t)
		declared := map[string]bool{}
		for _, c := range append(slices.Clone(tl.Chains), lt.Chains...) {
			if !declared[c] {
				declared[c] = true
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
		}
		for _, l := range append(slices.Clone(lt.HookLines), lt.IstioLines...) {
			fmt.Fprintf(&b, "-D %s %s\n", l.Chain, quoteArgs(l.Args))
		}
		for _, builtin := range []string{redirect.ChainPrerouting, redirect.ChainOutput} {
			if h, ok := tl.Hooks[builtin]; ok {
				fmt.Fprintf(&b, "-I %s 1 %s\n", builtin, ruleText(h))
			}
		}
		for _, c := range tl.Chains {
			for _, r := range tl.Rules[c] {
				fmt.Fprintf(&b, "-A %s %s\n", c, ruleText(r))
			}
		}
		for _, c := range lt.Chains {
			if !slices.Contains(tl.Chains, c) {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// revertText builds the one iptables-restore --noflush input that turns our live
// rules (now) back into what they were before an apply (was, what that apply read
// before it wrote): a failed apply's rollback. Each table that differs gets back
// its chains of ours with their rules, and its lines of ours in built-in chains
// (the jumps into ours, Istio's own forms) at the places they held among everyone
// else's rules, which the apply did not touch; chains of ours that were not there
// are deleted. A table that does not differ is left out, and with none the text is
// empty. With nothing of ours before (a pod's new namespace) it removes ours, as
// restoreText(nil, now) does, but a line of Istio's forms in a built-in chain: the
// family held no chain of ours, so such a line is someone else's (see ours).
func revertText(was, now map[redirect.Table]*liveTable) string {
	programmed := false
	for _, lt := range was {
		programmed = programmed || len(lt.Chains) > 0
	}
	var b strings.Builder
	for _, t := range redirect.TableOrder {
		w, n := was[t], now[t]
		if w == nil {
			w = &liveTable{Lines: map[string][]DumpLine{}}
		}
		if n == nil {
			n = &liveTable{Lines: map[string][]DumpLine{}}
		}
		if !programmed && n.IstioLines != nil {
			others := *n
			others.IstioLines = nil
			n = &others
		}
		if reflect.DeepEqual(w, n) {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t)
		declared := map[string]bool{}
		for _, c := range append(slices.Clone(w.Chains), n.Chains...) {
			if !declared[c] {
				declared[c] = true
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
		}
		for _, l := range append(slices.Clone(n.HookLines), n.IstioLines...) {
			fmt.Fprintf(&b, "-D %s %s\n", l.Chain, quoteArgs(l.Args))
		}
		// Inserted in the order of their places, each goes where it was: the rules
		// before it are the ones that were before it.
		builtin := append(slices.Clone(w.HookLines), w.IstioLines...)
		slices.SortStableFunc(builtin, func(a, b DumpLine) int {
			return cmp.Or(cmp.Compare(a.Chain, b.Chain), cmp.Compare(a.Pos, b.Pos))
		})
		for _, l := range builtin {
			fmt.Fprintf(&b, "-I %s %d %s\n", l.Chain, l.Pos, quoteArgs(l.Args))
		}
		for _, c := range w.Chains {
			for _, l := range w.Lines[c] {
				fmt.Fprintf(&b, "-A %s %s\n", c, quoteArgs(l.Args))
			}
		}
		for _, c := range n.Chains {
			if !slices.Contains(w.Chains, c) {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// quoteArgs re-quotes words that iptables-save printed quoted (comments).
func quoteArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			a = `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
