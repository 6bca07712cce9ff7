package nftables

import (
	"fmt"
	"slices"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// liveTable is one of our tables as read from the kernel (see readOurs).
type liveTable struct {
	id     tableID
	family redirect.Family
	// dormant tables keep their chains but see no packets.
	dormant bool
	chains  []liveChain
	// sets holds the names of named sets: we never make any, so in a table of ours
	// they are differences.
	sets []string
}

type liveChain struct {
	name   string
	base   *baseChain // nil for a regular chain
	policy string     // a base chain's: accept or drop
	rules  []liveRule
}

type liveRule struct {
	handle uint64
	// rule is what the expressions decoded to; ok is false when they are not a rule
	// this backend writes, and then the rule equals no planned rule.
	rule rule
	ok   bool
	// text is the rule in nft's syntax, as far as it decoded.
	text string
	// jump is the chain its verdict jumps or goes to, decoded or not ("": none).
	jump string
}

func (t *liveTable) chain(name string) *liveChain {
	if i := slices.IndexFunc(t.chains, func(c liveChain) bool { return c.name == name }); i >= 0 {
		return &t.chains[i]
	}
	return nil
}

func (c *liveChain) header() string {
	if c.base == nil {
		return ""
	}
	return c.base.textWithPolicy(c.policy)
}

// isOurs reports whether a table belongs to this backend. Only the ip and ip6
// families are ever used, so an inet table with a similar name is someone else's.
func isOurs(id tableID) bool {
	return (id.family == "ip" || id.family == "ip6") && strings.HasPrefix(id.name, TablePrefix)
}

// equal reports whether two rules match the same packets and do the same to them.
func (r *rule) equal(o *rule) bool {
	return r.target == o.target && slices.EqualFunc(r.matches, o.matches, func(a, b match) bool {
		return a.kind == b.kind && a.negate == b.negate && a.proto == b.proto && a.iface == b.iface &&
			a.prefix == b.prefix && slices.Equal(a.ports, b.ports) && a.id == b.id && a.mark == b.mark && a.states == b.states
	})
}

// diffTables lists, in words, every difference between the tables a plan needs and
// the tables found. It names the table, the chain and the rule.
func diffTables(want *ruleset, got []liveTable) []string {
	var diffs []string
	find := func(id tableID) *liveTable {
		for i := range got {
			if got[i].id == id {
				return &got[i]
			}
		}
		return nil
	}
	for i := range want.tables {
		w := &want.tables[i]
		g := find(w.id())
		if g == nil {
			diffs = append(diffs, fmt.Sprintf("table %s is missing", w.id()))
			continue
		}
		diffs = append(diffs, diffTable(w, g)...)
	}
	for i := range got {
		if !slices.ContainsFunc(want.tables, func(t table) bool { return t.id() == got[i].id }) {
			diffs = append(diffs, fmt.Sprintf("table %s is not in the plan", got[i].id))
		}
	}
	return diffs
}

func diffTable(want *table, got *liveTable) []string {
	var diffs []string
	if got.dormant {
		diffs = append(diffs, fmt.Sprintf("table %s is dormant: its chains see no packets", got.id))
	}
	for _, s := range got.sets {
		diffs = append(diffs, fmt.Sprintf("table %s: unexpected set %q", got.id, s))
	}
	for i := range want.chains {
		w := &want.chains[i]
		g := got.chain(w.name)
		where := fmt.Sprintf("table %s chain %s", got.id, w.name)
		if g == nil {
			diffs = append(diffs, where+" is missing")
			continue
		}
		switch {
		case w.base == nil && g.base == nil:
		case g.base == nil:
			diffs = append(diffs, fmt.Sprintf("%s: is a regular chain, want %q", where, w.base.text()))
		case w.base == nil:
			diffs = append(diffs, fmt.Sprintf("%s: is a base chain (%q), want a regular chain", where, g.header()))
		case *w.base != *g.base || g.policy != "accept":
			diffs = append(diffs, fmt.Sprintf("%s: hook is %q, want %q", where, g.header(), w.base.text()))
		}
		diffs = append(diffs, diffRules(where, want.family, w.rules, g.rules)...)
	}
	for i := range got.chains {
		if !slices.ContainsFunc(want.chains, func(c chain) bool { return c.name == got.chains[i].name }) {
			diffs = append(diffs, fmt.Sprintf("table %s: chain %s is not in the plan", got.id, got.chains[i].name))
		}
	}
	return diffs
}

// diffRules compares rule lists through their longest common subsequence, so one
// missing rule is reported as one missing rule, not as every later rule moved.
// A rule removed and another added at the same place is reported as different.
func diffRules(where string, f redirect.Family, want []rule, got []liveRule) []string {
	same := func(i, j int) bool { return got[j].ok && want[i].equal(&got[j].rule) }
	n, m := len(want), len(got)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if same(i, j) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var diffs []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && same(i, j):
			i, j = i+1, j+1
		case i < n && j < m && lcs[i+1][j+1] == lcs[i][j]:
			diffs = append(diffs, fmt.Sprintf("%s: rule %d is %q, want %q", where, i+1, got[j].text, want[i].text(f)))
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			diffs = append(diffs, fmt.Sprintf("%s: extra rule %q", where, got[j].text))
			j++
		default:
			diffs = append(diffs, fmt.Sprintf("%s: missing rule %d %q", where, i+1, want[i].text(f)))
			i++
		}
	}
	return diffs
}

// liveText prints live tables in the syntax of `nft list table`.
func liveText(tables []liveTable) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "table %s {\n", t.id)
		if t.dormant {
			b.WriteString("\tflags dormant\n")
		}
		for _, s := range t.sets {
			fmt.Fprintf(&b, "\t# set %s: not made by istio-cni, its elements are not shown\n", s)
		}
		for i, c := range t.chains {
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "\tchain %s {\n", c.name)
			if c.base != nil {
				fmt.Fprintf(&b, "\t\t%s\n", c.header())
			}
			for _, r := range c.rules {
				fmt.Fprintf(&b, "\t\t%s\n", r.text)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// rulesetOf is the ruleset that writes tables read back (found) again as they
// were: the rollback of a failed apply puts back what the apply found. It can
// only hold what this backend writes: a table with a rule that did not decode, a
// named set, a dormant table, or a base chain on another hook or with another
// policy is refused, naming it.
func rulesetOf(found []liveTable) (*ruleset, error) {
	rs := &ruleset{}
	for _, lt := range found {
		if lt.dormant {
			return nil, fmt.Errorf("table %s is dormant", lt.id)
		}
		if len(lt.sets) > 0 {
			return nil, fmt.Errorf("table %s holds the set %q", lt.id, lt.sets[0])
		}
		t := table{family: lt.family, name: lt.id.name}
		for _, lc := range lt.chains {
			if lc.base != nil && (lc.policy != "accept" || lc.base.hook != "prerouting" && lc.base.hook != "output") {
				return nil, fmt.Errorf("table %s chain %s: %q is not a hook this backend writes", lt.id, lc.name, lc.header())
			}
			ch := chain{name: lc.name, base: lc.base}
			for i, lr := range lc.rules {
				if !lr.ok {
					return nil, fmt.Errorf("table %s chain %s: rule %d %q is not one this backend writes", lt.id, lc.name, i+1, lr.text)
				}
				ch.rules = append(ch.rules, lr.rule)
			}
			t.chains = append(t.chains, ch)
		}
		rs.tables = append(rs.tables, t)
	}
	return rs, nil
}
