package nftables

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// listedTable is one table as `nft list ruleset` prints it, split into the parts
// that are compared: each chain's hook line and rules, in order.
type listedTable struct {
	id     tableID
	chains []listedChain
	// other holds table-level lines that are neither chains nor blank (sets, flags):
	// we never create them, so in a table of ours they are differences.
	other []string
}

type listedChain struct {
	name   string
	header string // "type ... policy accept;" for a base chain, "" otherwise
	rules  []string
	// handles[i] is rules[i]'s handle when listed with -a, else 0.
	handles []int
}

func (t *listedTable) chain(name string) *listedChain {
	for i := range t.chains {
		if t.chains[i].name == name {
			return &t.chains[i]
		}
	}
	return nil
}

var handleComment = regexp.MustCompile(`\s+# handle (\d+)$`)

// stripHandle removes the "# handle N" comment `nft -a` appends.
func stripHandle(line string) (string, int) {
	m := handleComment.FindStringSubmatchIndex(line)
	if m == nil {
		return line, 0
	}
	h, _ := strconv.Atoi(line[m[2]:m[3]])
	return line[:m[0]], h
}

// isOurs reports whether a table belongs to this backend. Only the ip and ip6
// families are ever used, so an inet table with a similar name is someone else's.
func isOurs(id tableID) bool {
	return (id.family == "ip" || id.family == "ip6") && strings.HasPrefix(id.name, TablePrefix)
}

// parseListing reads `nft list ruleset` output (with or without -a) and returns our
// tables. Other tables are skipped without being interpreted, so whatever they hold
// cannot make parsing fail.
func parseListing(text string) ([]listedTable, error) {
	var out []listedTable
	var cur *listedTable
	var ch *listedChain
	skipping := false
	for n, raw := range strings.Split(text, "\n") {
		line, handle := stripHandle(strings.TrimRight(raw, " \t"))
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, " ") {
			// Top level: a table opens or closes.
			switch {
			case strings.HasPrefix(line, "table ") && strings.HasSuffix(line, " {"):
				f := strings.Fields(strings.TrimSuffix(line, " {"))
				if len(f) != 3 {
					return nil, fmt.Errorf("line %d: unexpected table line %q", n+1, raw)
				}
				id := tableID{family: f[1], name: f[2]}
				skipping = !isOurs(id)
				if !skipping {
					out = append(out, listedTable{id: id})
					cur = &out[len(out)-1]
				}
			case line == "}":
				cur, ch, skipping = nil, nil, false
			default:
				if !skipping {
					return nil, fmt.Errorf("line %d: unexpected line %q outside a table", n+1, raw)
				}
			}
			continue
		}
		if skipping {
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: %q outside a table", n+1, raw)
		}
		body := strings.TrimSpace(line)
		depth := len(line) - len(strings.TrimLeft(line, "\t"))
		switch {
		case depth == 1 && strings.HasPrefix(body, "chain ") && strings.HasSuffix(body, " {"):
			cur.chains = append(cur.chains, listedChain{name: strings.TrimSuffix(strings.TrimPrefix(body, "chain "), " {")})
			ch = &cur.chains[len(cur.chains)-1]
		case depth == 1 && body == "}":
			ch = nil
		case depth == 1 && ch == nil:
			cur.other = append(cur.other, body)
		case ch != nil && strings.HasPrefix(body, "type ") && len(ch.rules) == 0 && ch.header == "":
			ch.header = body
		case ch != nil && depth == 2:
			ch.rules = append(ch.rules, body)
			ch.handles = append(ch.handles, handle)
		default:
			// Deeper nesting belongs to a set or map, which we never create.
			cur.other = append(cur.other, body)
		}
	}
	return out, nil
}

// diffTables lists, in words, every difference between the tables a plan needs and
// the tables found. It names the table, the chain and the rule.
func diffTables(want, got []listedTable) []string {
	var diffs []string
	find := func(ts []listedTable, id tableID) *listedTable {
		for i := range ts {
			if ts[i].id == id {
				return &ts[i]
			}
		}
		return nil
	}
	for i := range want {
		w := &want[i]
		g := find(got, w.id)
		if g == nil {
			diffs = append(diffs, fmt.Sprintf("table %s is missing", w.id))
			continue
		}
		diffs = append(diffs, diffTable(w, g)...)
	}
	for i := range got {
		if find(want, got[i].id) == nil {
			diffs = append(diffs, fmt.Sprintf("table %s is not in the plan", got[i].id))
		}
	}
	return diffs
}

func diffTable(want, got *listedTable) []string {
	var diffs []string
	for _, o := range got.other {
		diffs = append(diffs, fmt.Sprintf("table %s: unexpected %q", got.id, o))
	}
	for i := range want.chains {
		w := &want.chains[i]
		g := got.chain(w.name)
		where := fmt.Sprintf("table %s chain %s", want.id, w.name)
		if g == nil {
			diffs = append(diffs, where+" is missing")
			continue
		}
		if g.header != w.header {
			switch {
			case g.header == "":
				diffs = append(diffs, fmt.Sprintf("%s: is a regular chain, want %q", where, w.header))
			case w.header == "":
				diffs = append(diffs, fmt.Sprintf("%s: is a base chain (%q), want a regular chain", where, g.header))
			default:
				diffs = append(diffs, fmt.Sprintf("%s: hook is %q, want %q", where, g.header, w.header))
			}
		}
		diffs = append(diffs, diffRules(where, w.rules, g.rules)...)
	}
	for i := range got.chains {
		if want.chain(got.chains[i].name) == nil {
			diffs = append(diffs, fmt.Sprintf("table %s: chain %s is not in the plan", got.id, got.chains[i].name))
		}
	}
	return diffs
}

// diffRules compares rule lists through their longest common subsequence, so one
// missing rule is reported as one missing rule, not as every later rule moved.
// A rule removed and another added at the same place is reported as different.
func diffRules(where string, want, got []string) []string {
	n, m := len(want), len(got)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if want[i] == got[j] {
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
		case i < n && j < m && want[i] == got[j]:
			i, j = i+1, j+1
		case i < n && j < m && lcs[i+1][j+1] == lcs[i][j]:
			diffs = append(diffs, fmt.Sprintf("%s: rule %d is %q, want %q", where, i+1, got[j], want[i]))
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			diffs = append(diffs, fmt.Sprintf("%s: extra rule %q", where, got[j]))
			j++
		default:
			diffs = append(diffs, fmt.Sprintf("%s: missing rule %d %q", where, i+1, want[i]))
			i++
		}
	}
	return diffs
}
