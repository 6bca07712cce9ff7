package redirect

import (
	"fmt"
	"slices"
)

// LiveChain is one of our chains as a backend reads it back from the kernel:
// enough of it to tell a capture that was cut or emptied from a whole one without
// the plan that wrote it (see CutOff).
type LiveChain struct {
	// Table names the chain's family and table, as the backend's differences do.
	Table string
	Name  string
	// Hook is a chain the kernel runs packets through by itself (iptables'
	// built-in PREROUTING and OUTPUT, an nftables base chain): nothing jumps to it.
	Hook bool
	// Rules is how many rules it holds (in a built-in chain: its jumps into ours).
	Rules int
	// Jumps are the chains of ours, in the same table, that its rules jump or go to.
	Jumps []string
}

// CutOff lists, in words, what in chains shows a capture cut or emptied,
// whatever plan wrote it: a chain that sends packets on to ours but that nothing
// sends packets to (the jump into it deleted), and a chain that packets are sent
// to but that holds no rules (flushed), in sorted order. No plan has either (Plan.Check), and
// neither has Istio's own layout; so neither a pod's settings edited since its
// ADD nor another version of the plugin makes them.
func CutOff(chains []LiveChain) []string {
	type key struct{ table, chain string }
	jumped := map[key]bool{}
	for _, c := range chains {
		for _, j := range c.Jumps {
			if j != c.Name {
				jumped[key{c.Table, j}] = true
			}
		}
	}
	var cut []string
	for _, c := range chains {
		switch {
		case c.Hook:
		case slices.ContainsFunc(c.Jumps, func(j string) bool { return j != c.Name }) && !jumped[key{c.Table, c.Name}]:
			cut = append(cut, fmt.Sprintf("%s: chain %s sends packets on to others of ours, but no rule jumps to it", c.Table, c.Name))
		case c.Rules == 0 && jumped[key{c.Table, c.Name}]:
			cut = append(cut, fmt.Sprintf("%s: chain %s holds no rules, but rules jump to it", c.Table, c.Name))
		}
	}
	slices.Sort(cut)
	return cut
}
