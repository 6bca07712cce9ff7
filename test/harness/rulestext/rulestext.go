// Package rulestext turns what iptables-save and nft print into text that tests
// compare: what a namespace's rules are, without what changes by itself. Only tests
// import it.
package rulestext

import (
	"regexp"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// Saved is iptables-save's output without its dated comment lines, its counters,
// and the tables that hold nothing (only built-in chains with policy ACCEPT and no
// rules): such a table has no effect, and iptables creates it on first use and
// never removes it (legacy cannot).
func Saved(s string) string {
	var out, table []string
	empty := true
	for _, l := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(l, "#") || l == "":
		case strings.HasPrefix(l, "*"):
			table, empty = []string{l}, true
		case l == "COMMIT":
			if !empty {
				out = append(append(out, table...), l)
			}
		default:
			table = append(table, counters.ReplaceAllString(l, ""))
			if !(strings.HasPrefix(l, ":") && redirect.IsBuiltin(strings.Fields(l[1:])[0]) && strings.Fields(l)[1] == "ACCEPT") {
				empty = false
			}
		}
	}
	return strings.Join(out, "\n")
}
