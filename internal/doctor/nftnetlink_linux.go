package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"

	gnft "github.com/google/nftables"

	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// The plugin's nftables backend reads rules back with nft. Where nft is not
// installed (a minimal node or image; the agent image carries it) the doctor
// reads our tables through netlink instead. Netlink gives the tables, chains
// and the number of rules in each, not nft's text of a rule, so this check is
// coarser than the plugin's CHECK: a rule deleted or added is found, a rule changed
// in place is not. Inspect says so in its output.

// netlinkNote is added to the problems-free output when the netlink check stood in
// for nft.
const netlinkNote = "nft is not installed here: our tables, chains and the number of rules in each were compared through netlink, not each rule's text " +
	"(for a rule-by-rule comparison run istio-cni-doctor on the node, where nft is installed)"

// haveNft reports whether the nft binary the nftables backend reads rules with is
// in PATH.
func haveNft() bool {
	_, err := exec.LookPath("nft")
	return err == nil
}

// haveIptablesSave reports whether any iptables-save the iptables backend could use
// is in PATH.
func haveIptablesSave() bool {
	return lookPath("iptables-save", "iptables-nft-save", "iptables-legacy-save") != ""
}

// nftShape is a table of ours reduced to what netlink tells without decoding rules:
// each chain's hook and its number of rules.
type nftShape struct {
	family, name string
	chains       map[string]chainShape
}

type chainShape struct {
	base  bool
	rules int
}

// netlinkBackend is a read-only capture.Backend that compares the shape of our
// tables (see nftShape) with the plan's.
type netlinkBackend struct{}

func (netlinkBackend) Name() string { return "nftables" }

func (netlinkBackend) Apply(context.Context, *redirect.Plan) (bool, error) {
	return false, errors.New("the doctor never writes rules")
}

func (netlinkBackend) Cleanup(context.Context) error {
	return errors.New("the doctor never writes rules")
}

// Verify lists the differences in shape between our live tables and the plan's, in
// the calling thread's network namespace.
func (netlinkBackend) Verify(_ context.Context, plan *redirect.Plan) ([]string, error) {
	text, err := nftables.Render(plan)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: %w", err)
	}
	want := shapesFromText(text)
	got, _, err := readShapes()
	if err != nil {
		return nil, fmt.Errorf("verify nftables through netlink: %w", err)
	}
	return diffShapes(want, got), nil
}

// iptablesNftChains is a read-only capture.Backend standing in for the iptables
// one where iptables-save is missing: the ISTIO chains iptables-nft keeps in
// nftables tables are seen through netlink; iptables-legacy rules are not.
type iptablesNftChains struct{ netlinkBackend }

func (iptablesNftChains) Name() string { return "iptables-nft" }

// Verify lists our iptables-nft chains; only an empty plan is checked.
func (iptablesNftChains) Verify(_ context.Context, plan *redirect.Plan) ([]string, error) {
	if len(plan.Families) > 0 {
		return nil, errors.New("verify iptables-nft through netlink: only the absence of rules can be checked")
	}
	_, chains, err := readShapes()
	if err != nil {
		return nil, fmt.Errorf("verify iptables-nft through netlink: %w", err)
	}
	for i, c := range chains {
		chains[i] = c + " (iptables-nft) is not expected"
	}
	return chains, nil
}

// shapesFromText reads the tables of an nft listing (as nftables.Render prints it).
func shapesFromText(text string) []nftShape {
	var out []nftShape
	var table *nftShape
	chain := ""
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case len(f) == 4 && f[0] == "table" && f[3] == "{":
			out = append(out, nftShape{family: f[1], name: f[2], chains: map[string]chainShape{}})
			table, chain = &out[len(out)-1], ""
		case table == nil:
		case len(f) == 3 && f[0] == "chain" && f[2] == "{":
			chain = f[1]
			table.chains[chain] = chainShape{}
		case f[0] == "}":
			chain = ""
		case chain == "":
		case f[0] == "type" && strings.Contains(l, " hook "):
			c := table.chains[chain]
			c.base = true
			table.chains[chain] = c
		default:
			c := table.chains[chain]
			c.rules++
			table.chains[chain] = c
		}
	}
	return out
}

// readShapes reads our tables through netlink, and the names of chains of ours
// (ISTIO_*) in other tables: iptables-nft keeps its rules in nftables tables, so
// its ISTIO chains show there (iptables-legacy rules do not).
func readShapes() ([]nftShape, []string, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, nil, err
	}
	defer self.Close()
	c, err := gnft.New(gnft.WithNetNSFd(int(self.Fd())))
	if err != nil {
		return nil, nil, err
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		return nil, nil, fmt.Errorf("list chains: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil, nil, fmt.Errorf("list tables: %w", err)
	}
	byID := map[string]*nftShape{}
	var out []nftShape
	for _, t := range tables {
		if fam := familyName(t.Family); (fam == "ip" || fam == "ip6") && strings.HasPrefix(t.Name, nftables.TablePrefix) {
			out = append(out, nftShape{family: fam, name: t.Name, chains: map[string]chainShape{}})
		}
	}
	for i := range out {
		byID[out[i].family+" "+out[i].name] = &out[i]
	}
	var iptablesNft []string
	for _, ch := range chains {
		fam := familyName(ch.Table.Family)
		s := byID[fam+" "+ch.Table.Name]
		if s == nil {
			if strings.HasPrefix(ch.Name, "ISTIO") {
				iptablesNft = append(iptablesNft, fmt.Sprintf("table %s %s chain %s", fam, ch.Table.Name, ch.Name))
			}
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("list rules of %s %s chain %s: %w", fam, ch.Table.Name, ch.Name, err)
		}
		s.chains[ch.Name] = chainShape{base: ch.Hooknum != nil, rules: len(rules)}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].family+out[i].name < out[j].family+out[j].name })
	sort.Strings(iptablesNft)
	return out, iptablesNft, nil
}

func familyName(f gnft.TableFamily) string {
	switch f {
	case gnft.TableFamilyIPv4:
		return "ip"
	case gnft.TableFamilyIPv6:
		return "ip6"
	case gnft.TableFamilyINet:
		return "inet"
	case gnft.TableFamilyARP:
		return "arp"
	case gnft.TableFamilyBridge:
		return "bridge"
	case gnft.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family-%d", f)
}

func diffShapes(want, got []nftShape) []string {
	var diffs []string
	index := func(list []nftShape) map[string]nftShape {
		m := map[string]nftShape{}
		for _, s := range list {
			m[s.family+" "+s.name] = s
		}
		return m
	}
	w, g := index(want), index(got)
	for _, s := range want {
		id := s.family + " " + s.name
		live, ok := g[id]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("table %s is missing", id))
			continue
		}
		for _, name := range sortedKeys(s.chains) {
			wc := s.chains[name]
			lc, ok := live.chains[name]
			switch {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("table %s: chain %s is missing", id, name))
			case wc.base != lc.base:
				diffs = append(diffs, fmt.Sprintf("table %s: chain %s: hooked %t, want %t", id, name, lc.base, wc.base))
			case wc.rules != lc.rules:
				diffs = append(diffs, fmt.Sprintf("table %s: chain %s has %d rules, want %d", id, name, lc.rules, wc.rules))
			}
		}
		for _, name := range sortedKeys(live.chains) {
			if _, ok := s.chains[name]; !ok {
				diffs = append(diffs, fmt.Sprintf("table %s: unexpected chain %s", id, name))
			}
		}
	}
	for _, s := range got {
		if _, ok := w[s.family+" "+s.name]; !ok {
			diffs = append(diffs, fmt.Sprintf("unexpected table %s %s", s.family, s.name))
		}
	}
	return diffs
}

func sortedKeys(m map[string]chainShape) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// shapesText renders live shapes for people.
func shapesText(shapes []nftShape) string {
	var b strings.Builder
	for _, s := range shapes {
		fmt.Fprintf(&b, "table %s %s\n", s.family, s.name)
		for _, name := range sortedKeys(s.chains) {
			c := s.chains[name]
			hook := ""
			if c.base {
				hook = ", hooked"
			}
			fmt.Fprintf(&b, "  chain %s: %d rules%s\n", name, c.rules, hook)
		}
	}
	return b.String()
}
