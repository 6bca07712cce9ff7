package nftables

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

var _ capture.Backend = (*Backend)(nil)

// testNS creates a throwaway network namespace removed when the test ends.
func testNS(t testing.TB) string {
	t.Helper()
	root.Require(t)
	path, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testns.Delete(path); err != nil {
			t.Errorf("delete namespace: %v", err)
		}
	})
	return path
}

// in runs fn inside the namespace.
func in(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := netns.Do(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// command runs a program inside the namespace and returns its output.
func command(t testing.TB, ns string, stdin string, name string, args ...string) string {
	t.Helper()
	var out []byte
	in(t, ns, func() error {
		cmd := exec.Command(name, args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		var err error
		out, err = cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out)
}

// renderText is the text of the plan's tables as nft lists them.
func renderText(t testing.TB, plan *redirect.Plan) string {
	t.Helper()
	rs, err := translate(plan, testGroups)
	if err != nil {
		t.Fatal(err)
	}
	return rs.text()
}

// readNS reads our tables in the namespace, as Verify does.
func readNS(t testing.TB, ns string) []liveTable {
	t.Helper()
	var tables []liveTable
	in(t, ns, func() error {
		c, err := dialHere()
		if err != nil {
			return err
		}
		defer c.Close()
		tables, err = readOurs(c.Conn)
		return err
	})
	return tables
}

// ruleHandle finds the handle of a chain's rule (1-based n) in our live tables.
func ruleHandle(t testing.TB, ns, table, chain string, n int) string {
	t.Helper()
	for _, tb := range readNS(t, ns) {
		if c := tb.chain(chain); tb.id.name == table && c != nil && n <= len(c.rules) {
			return strconv.FormatUint(c.rules[n-1].handle, 10)
		}
	}
	t.Fatalf("no rule %d in %s chain %s", n, table, chain)
	return ""
}

func testBackends() []struct {
	name string
	b    *Backend
} {
	return []struct {
		name string
		b    *Backend
	}{
		{"exec", &Backend{nft: "nft", groups: testGroups, applyVia: applyExec}},
		{"netlink", &Backend{nft: "nft", groups: testGroups, applyVia: applyNetlink}},
	}
}

// TestKernelApplyVerifyCleanup proves, for every case and both apply paths, in a
// fresh namespace: the kernel lists exactly the rendered text (nft's listing and our
// netlink read alike), Verify finds nothing, a second Apply changes nothing, a rule
// deleted by hand is reported and restored by the next Apply, and Cleanup leaves
// the ruleset as it was.
func TestKernelApplyVerifyCleanup(t *testing.T) {
	ctx := context.Background()
	for _, tb := range testBackends() {
		for _, c := range specCases {
			t.Run(tb.name+"/"+c.name, func(t *testing.T) {
				ns := testNS(t)
				plan := c.plan(t)
				want := renderText(t, plan)
				before := command(t, ns, "", "nft", "list", "ruleset")
				b := tb.b

				var changed bool
				in(t, ns, func() (err error) { changed, err = b.Apply(ctx, plan); return err })
				if !changed {
					t.Error("first Apply reported no change")
				}
				if diff := cmp.Diff(want, command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
					t.Errorf("kernel listing differs from the render (-render +kernel):\n%s", diff)
				}
				if diff := cmp.Diff(want, liveText(readNS(t, ns))); diff != "" {
					t.Errorf("netlink read differs from the render (-render +read):\n%s", diff)
				}
				verify := func() []string {
					var d []string
					in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
					return d
				}
				if d := verify(); len(d) != 0 {
					t.Errorf("Verify after Apply: %q", d)
				}
				in(t, ns, func() (err error) { changed, err = b.Apply(ctx, plan); return err })
				if changed {
					t.Error("second Apply reported a change")
				}

				// Break one rule: the last rule of the last chain of the first table.
				tab := readNS(t, ns)[0]
				ch := tab.chains[len(tab.chains)-1]
				victim := ch.rules[len(ch.rules)-1]
				command(t, ns, "", "nft", "delete", "rule", tab.id.family, tab.id.name, ch.name, "handle", itoa(int(victim.handle)))
				d := verify()
				if len(d) != 1 || !strings.Contains(d[0], "missing rule") || !strings.Contains(d[0], strconv.Quote(victim.text)) || !strings.Contains(d[0], ch.name) {
					t.Errorf("Verify after deleting %q from %s: got %q, want one missing-rule difference naming it", victim.text, ch.name, d)
				}
				in(t, ns, func() (err error) { changed, err = b.Apply(ctx, plan); return err })
				if !changed {
					t.Error("Apply after a deleted rule reported no change")
				}
				if d := verify(); len(d) != 0 {
					t.Errorf("Verify after repairing Apply: %q", d)
				}

				in(t, ns, func() error { return b.Cleanup(ctx) })
				if diff := cmp.Diff(before, command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
					t.Errorf("Cleanup left the ruleset changed (-before +after):\n%s", diff)
				}
				in(t, ns, func() error { return b.Cleanup(ctx) }) // idempotent
			})
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestAnApplyOverAnotherPlanIsListedAsTheRender: an apply over another plan's
// tables, which makes a table that plan lacked and remakes the others, leaves
// them listed by nft as the plan renders, in the render's order, on both write
// paths. The new table was made before the remade ones and listed first.
func TestAnApplyOverAnotherPlanIsListedAsTheRender(t *testing.T) {
	ctx := context.Background()
	byName := func(name string) specCase {
		return specCases[slices.IndexFunc(specCases, func(c specCase) bool { return c.name == name })]
	}
	first, second := byName("default-sidecar").plan(t), byName("dns-servers").plan(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testNS(t)
			in(t, ns, func() error { _, err := tb.b.Apply(ctx, first); return err })
			in(t, ns, func() error { _, err := tb.b.Apply(ctx, second); return err })
			if diff := cmp.Diff(renderText(t, second), command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
				t.Errorf("kernel listing differs from the render (-render +kernel):\n%s", diff)
			}
		})
	}
}

// TestKernelCleanupKeepsForeignTables proves Apply and Cleanup touch only our
// tables: an iptables-nft nat table and an unrelated inet table, created before,
// are listed identically afterwards.
func TestKernelCleanupKeepsForeignTables(t *testing.T) {
	ctx := context.Background()
	ns := testNS(t)
	command(t, ns, "", "iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "RETURN")
	command(t, ns, "table inet foreign {\n\tchain c {\n\t\ttype filter hook output priority 10; policy accept;\n\t\ttcp dport 9 counter accept\n\t}\n}\n", "nft", "-f", "-")
	before := command(t, ns, "", "nft", "list", "ruleset")
	b := &Backend{nft: "nft", groups: testGroups}
	plan := specCases[0].plan(t)
	in(t, ns, func() error { _, err := b.Apply(ctx, plan); return err })
	var d []string
	in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
	if len(d) != 0 {
		t.Errorf("Verify beside foreign tables: %q", d)
	}
	in(t, ns, func() error { return b.Cleanup(ctx) })
	after := command(t, ns, "", "nft", "list", "ruleset")
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("foreign tables changed (-before +after):\n%s", diff)
	}
}

// TestKernelApplyRemovesStaleTables proves a plan that no longer needs a table
// (TPROXY's mangle, IPv6) removes it, and Verify reports a stale table of ours.
func TestKernelApplyRemovesStaleTables(t *testing.T) {
	ctx := context.Background()
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testNS(t)
			big := caseNamed(t, "everything").plan(t)
			small := caseNamed(t, "default-sidecar").plan(t)
			b := tb.b
			in(t, ns, func() error { _, err := b.Apply(ctx, big); return err })
			var d []string
			in(t, ns, func() (err error) { d, err = b.Verify(ctx, small); return err })
			if !slices.Contains(d, "table ip istio-proxy-mangle is not in the plan") {
				t.Errorf("Verify of the smaller plan: %q, want the stale mangle table reported", d)
			}
			in(t, ns, func() error { _, err := b.Apply(ctx, small); return err })
			want := renderText(t, small)
			if diff := cmp.Diff(want, command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
				t.Errorf("after applying the smaller plan (-render +kernel):\n%s", diff)
			}
		})
	}
}

// TestKernelVerifyReportsForeignEdits proves Verify reports a rule added to one of
// our chains and a changed hook, and Apply undoes both.
func TestKernelVerifyReportsForeignEdits(t *testing.T) {
	ctx := context.Background()
	ns := testNS(t)
	b := &Backend{nft: "nft", groups: testGroups}
	plan := specCases[0].plan(t)
	in(t, ns, func() error { _, err := b.Apply(ctx, plan); return err })
	command(t, ns, "", "nft", "add", "rule", "ip", "istio-proxy-nat", "ISTIO_OUTPUT", "tcp", "dport", "9", "accept")
	command(t, ns, "", "nft", "add", "chain", "ip", "istio-proxy-nat", "ISTIO_EXTRA")
	var d []string
	in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
	want := []string{
		`table ip istio-proxy-nat chain ISTIO_OUTPUT: extra rule "tcp dport 9 accept"`,
		"table ip istio-proxy-nat: chain ISTIO_EXTRA is not in the plan",
	}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("Verify (-want +got):\n%s", diff)
	}
	in(t, ns, func() error { _, err := b.Apply(ctx, plan); return err })
	in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
	if len(d) != 0 {
		t.Errorf("Verify after Apply: %q", d)
	}
}

// TestKernelApplyRejectsUnknownGroup proves a group name the host does not know
// fails Apply with the name, and programs nothing.
func TestKernelApplyRejectsUnknownGroup(t *testing.T) {
	ctx := context.Background()
	ns := testNS(t)
	s := sidecarSpec()
	s.OwnerGroups.Groups = []string{"no-such-group-xyz"}
	plan, err := redirect.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	in(t, ns, func() error {
		_, err := NewBackend().Apply(ctx, plan)
		if err == nil || !strings.Contains(err.Error(), "no-such-group-xyz") {
			t.Errorf("Apply: got %v, want an error naming the group", err)
		}
		return nil
	})
	if out := command(t, ns, "", "nft", "list", "ruleset"); out != "" {
		t.Errorf("failed Apply left rules:\n%s", out)
	}
}

func caseNamed(t testing.TB, name string) specCase {
	for _, c := range specCases {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no case %s", name)
	return specCase{}
}

// everyKindPlan uses every match and target kind, both polarities, in both
// families, including forms the builder does not produce today (negated protocol,
// negated multi-state, source port sets), so both apply paths are checked against
// the kernel for all of them.
func everyKindPlan() *redirect.Plan {
	tcp := redirect.Match{Kind: redirect.MatchProtocol, Proto: redirect.TCP}
	udp := redirect.Match{Kind: redirect.MatchProtocol, Proto: redirect.UDP}
	rule := func(chain string, tg redirect.Target, ms ...redirect.Match) redirect.Rule {
		return redirect.Rule{Chain: chain, Matches: ms, Target: tg}
	}
	ret := redirect.Target{Kind: redirect.TargetReturn}
	family := func(f redirect.Family, host, wide netip.Prefix) redirect.FamilyPlan {
		mangle := []redirect.Rule{
			rule("PREROUTING", redirect.Target{Kind: redirect.TargetJump, Chain: "ISTIO_X"}),
			rule("ISTIO_X", ret, redirect.Match{Kind: redirect.MatchProtocol, Proto: redirect.UDP, Negate: true}, redirect.Match{Kind: redirect.MatchInIface, Iface: "eth0", Negate: true}),
			rule("ISTIO_X", ret, redirect.Match{Kind: redirect.MatchSource, Prefix: wide}, redirect.Match{Kind: redirect.MatchDest, Prefix: host, Negate: true}),
			rule("ISTIO_X", ret, redirect.Match{Kind: redirect.MatchSource, Prefix: host}, redirect.Match{Kind: redirect.MatchDest, Prefix: wide, Negate: true}),
			rule("ISTIO_X", ret, udp, redirect.Match{Kind: redirect.MatchSourcePort, Ports: []uint16{53, 5353}, Negate: true}, redirect.Match{Kind: redirect.MatchDestPort, Ports: []uint16{9}}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetDrop}, redirect.Match{Kind: redirect.MatchCTState, CTStates: []redirect.CTState{redirect.CTInvalid}}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetSaveMark}, redirect.Match{Kind: redirect.MatchCTState, Negate: true, CTStates: []redirect.CTState{redirect.CTInvalid, redirect.CTRelated}}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetRestoreMark}, redirect.Match{Kind: redirect.MatchCTState, Negate: true, CTStates: []redirect.CTState{redirect.CTInvalid}}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetSetMark, Mark: 7}, redirect.Match{Kind: redirect.MatchMark, Mark: 1, Negate: true}, redirect.Match{Kind: redirect.MatchConnMark, Mark: 2}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetAccept}, redirect.Match{Kind: redirect.MatchMark, Mark: 3}, redirect.Match{Kind: redirect.MatchConnMark, Mark: 4, Negate: true}),
			rule("ISTIO_X", redirect.Target{Kind: redirect.TargetTProxy, Port: 15006, Mark: 1337}, redirect.Match{Kind: redirect.MatchDest, Prefix: host, Negate: true}, tcp, redirect.Match{Kind: redirect.MatchDestPort, Ports: []uint16{80, 443}, Negate: true}),
			rule("OUTPUT", ret, redirect.Match{Kind: redirect.MatchOutIface, Iface: "lo"}, redirect.Match{Kind: redirect.MatchUIDOwner, Owner: "1337", Negate: true}, redirect.Match{Kind: redirect.MatchGIDOwner, Owner: "java"}),
		}
		nat := []redirect.Rule{
			rule("OUTPUT", redirect.Target{Kind: redirect.TargetJump, Chain: "ISTIO_Y"}, redirect.Match{Kind: redirect.MatchUIDOwner, Owner: "0"}, redirect.Match{Kind: redirect.MatchGIDOwner, Owner: "2", Negate: true}),
			rule("ISTIO_Y", redirect.Target{Kind: redirect.TargetRedirect, Port: 15001}, tcp, redirect.Match{Kind: redirect.MatchSourcePort, Ports: []uint16{7}}),
			rule("ISTIO_Y", redirect.Target{Kind: redirect.TargetRedirect, Port: 15053}, udp),
		}
		raw := []redirect.Rule{
			rule("OUTPUT", redirect.Target{Kind: redirect.TargetCTZone, Zone: 2}, udp, redirect.Match{Kind: redirect.MatchDestPort, Ports: []uint16{53}}),
			rule("PREROUTING", redirect.Target{Kind: redirect.TargetCTZone, Zone: 1}),
		}
		return redirect.FamilyPlan{Family: f, Tables: []redirect.TablePlan{
			{Table: redirect.TableMangle, Chains: []string{"ISTIO_X"}, Rules: mangle},
			{Table: redirect.TableNAT, Chains: []string{"ISTIO_Y"}, Rules: nat},
			{Table: redirect.TableRaw, Rules: raw},
		}}
	}
	return &redirect.Plan{Families: []redirect.FamilyPlan{
		family(redirect.IPv4, netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.96.0.0/12")),
		family(redirect.IPv6, netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fd00:10:96::/100")),
	}}
}

// TestKernelEveryKindBothPaths proves every match and target kind reaches the
// kernel through nft -f and through netlink, lists back as rendered, and reads
// back over netlink as the plan's rules.
func TestKernelEveryKindBothPaths(t *testing.T) {
	plan := everyKindPlan()
	if err := plan.Check(); err != nil {
		t.Fatalf("hand-made plan is invalid: %v", err)
	}
	want := renderText(t, plan)
	ctx := context.Background()
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testNS(t)
			in(t, ns, func() error { _, err := tb.b.Apply(ctx, plan); return err })
			if diff := cmp.Diff(want, command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
				t.Errorf("kernel listing differs from the render (-render +kernel):\n%s", diff)
			}
			if diff := cmp.Diff(want, liveText(readNS(t, ns))); diff != "" {
				t.Errorf("netlink read differs from the render (-render +read):\n%s", diff)
			}
			var d []string
			in(t, ns, func() (err error) { d, err = tb.b.Verify(ctx, plan); return err })
			if len(d) != 0 {
				t.Errorf("Verify after Apply: %q", d)
			}
		})
	}
}

// TestKernelVerifyReportsHandEdits proves Verify, reading over netlink, reports
// each kind of change someone makes with nft by hand, in words that name the
// table, chain and rule; that a counter or comment added to a rule is not a
// difference; and that the next Apply undoes every change.
func TestKernelVerifyReportsHandEdits(t *testing.T) {
	ctx := context.Background()
	nat := "istio-proxy-nat"
	cases := []struct {
		name, spec string
		// edit returns the nft commands (each one argument list) to run.
		edit func(t testing.TB, ns string) [][]string
		want []string
	}{
		{
			name: "rule changed", spec: "default-sidecar",
			edit: func(t testing.TB, ns string) [][]string {
				return [][]string{{"replace", "rule", "ip", nat, "ISTIO_REDIRECT", "handle", ruleHandle(t, ns, nat, "ISTIO_REDIRECT", 1), "meta", "l4proto", "tcp", "redirect", "to", ":15002"}}
			},
			want: []string{`table ip istio-proxy-nat chain ISTIO_REDIRECT: rule 1 is "meta l4proto tcp redirect to :15002", want "meta l4proto tcp redirect to :15001"`},
		},
		{
			name: "tproxy port changed", spec: "tproxy",
			edit: func(t testing.TB, ns string) [][]string {
				return [][]string{{"replace", "rule", "ip", "istio-proxy-mangle", "ISTIO_TPROXY", "handle", ruleHandle(t, ns, "istio-proxy-mangle", "ISTIO_TPROXY", 1),
					"ip", "daddr", "!=", "127.0.0.1", "meta", "l4proto", "tcp", "tproxy", "to", ":15007", "meta", "mark", "set", "0x539", "accept"}}
			},
			want: []string{`table ip istio-proxy-mangle chain ISTIO_TPROXY: rule 1 is "ip daddr != 127.0.0.1 meta l4proto tcp tproxy to :15007 meta mark set 0x00000539 accept", want "ip daddr != 127.0.0.1 meta l4proto tcp tproxy to :15006 meta mark set 0x00000539 accept"`},
		},
		{
			name: "statement added", spec: "default-sidecar",
			edit: func(t testing.TB, ns string) [][]string {
				return [][]string{{"replace", "rule", "ip", nat, "ISTIO_REDIRECT", "handle", ruleHandle(t, ns, nat, "ISTIO_REDIRECT", 1), "meta", "l4proto", "tcp", "log", "redirect", "to", ":15001"}}
			},
			want: []string{`table ip istio-proxy-nat chain ISTIO_REDIRECT: rule 1 is "meta l4proto tcp [log] [immediate Register=1 Data=0x3a99] [redir RegisterProtoMin=1 RegisterProtoMax=1 Flags=2]", want "meta l4proto tcp redirect to :15001"`},
		},
		{
			name: "counter and comment are no difference", spec: "default-sidecar",
			edit: func(t testing.TB, ns string) [][]string {
				return [][]string{{"replace", "rule", "ip", nat, "ISTIO_REDIRECT", "handle", ruleHandle(t, ns, nat, "ISTIO_REDIRECT", 1), "meta", "l4proto", "tcp", "counter", "redirect", "to", ":15001", "comment", `"by hand"`}}
			},
		},
		{
			name: "base chain deleted", spec: "default-sidecar",
			edit: func(testing.TB, string) [][]string {
				return [][]string{{"flush", "chain", "ip", nat, "output"}, {"delete", "chain", "ip", nat, "output"}}
			},
			want: []string{"table ip istio-proxy-nat chain output is missing"},
		},
		{
			name: "base chain hooked elsewhere", spec: "default-sidecar",
			edit: func(testing.TB, string) [][]string {
				return [][]string{{"flush", "chain", "ip", nat, "output"}, {"delete", "chain", "ip", nat, "output"},
					{"add", "chain", "ip", nat, "output", "{ type nat hook output priority 10; policy accept; }"},
					{"add", "rule", "ip", nat, "output", "jump", "ISTIO_OUTPUT"}}
			},
			want: []string{`table ip istio-proxy-nat chain output: hook is "type nat hook output priority 10; policy accept;", want "type nat hook output priority -100; policy accept;"`},
		},
		{
			name: "stray rule inserted", spec: "default-sidecar",
			edit: func(testing.TB, string) [][]string {
				return [][]string{{"insert", "rule", "ip", nat, "ISTIO_OUTPUT", "udp", "dport", "53", "drop"}}
			},
			want: []string{`table ip istio-proxy-nat chain ISTIO_OUTPUT: extra rule "udp dport 53 drop"`},
		},
		{
			name: "element of a set changed", spec: "dns-servers",
			edit: func(t testing.TB, ns string) [][]string {
				return [][]string{{"replace", "rule", "ip", nat, "ISTIO_OUTPUT", "handle", ruleHandle(t, ns, nat, "ISTIO_OUTPUT", 2),
					"oifname", "lo", "ip", "daddr", "!=", "127.0.0.1", "tcp", "dport", "!=", "{ 54, 15008 }", "meta", "skuid", "1337", "jump", "ISTIO_IN_REDIRECT"}}
			},
			want: []string{`table ip istio-proxy-nat chain ISTIO_OUTPUT: rule 2 is "oifname \"lo\" ip daddr != 127.0.0.1 tcp dport != { 54, 15008 } meta skuid 1337 jump ISTIO_IN_REDIRECT", want "oifname \"lo\" ip daddr != 127.0.0.1 tcp dport != { 53, 15008 } meta skuid 1337 jump ISTIO_IN_REDIRECT"`},
		},
		{
			name: "table made dormant and a set added", spec: "default-sidecar",
			edit: func(testing.TB, string) [][]string {
				return [][]string{{"add", "table", "ip", nat, "{ flags dormant; }"}, {"add", "set", "ip", nat, "extra", "{ type ipv4_addr; }"}}
			},
			want: []string{"table ip istio-proxy-nat is dormant: its chains see no packets", `table ip istio-proxy-nat: unexpected set "extra"`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := testNS(t)
			b := NewBackend()
			b.groups = testGroups
			plan := caseNamed(t, tc.spec).plan(t)
			in(t, ns, func() error { _, err := b.Apply(ctx, plan); return err })
			for _, args := range tc.edit(t, ns) {
				command(t, ns, "", "nft", args...)
			}
			var d []string
			in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
			if diff := cmp.Diff(tc.want, d); diff != "" {
				t.Errorf("Verify after the edit (-want +got):\n%s", diff)
			}
			var changed bool
			in(t, ns, func() (err error) { changed, err = b.Apply(ctx, plan); return err })
			if changed != (len(tc.want) > 0) {
				t.Errorf("Apply after the edit: changed=%v, want %v", changed, len(tc.want) > 0)
			}
			in(t, ns, func() (err error) { d, err = b.Verify(ctx, plan); return err })
			if len(d) != 0 {
				t.Errorf("Verify after Apply: %q", d)
			}
		})
	}
}

// TestRunReturnsWhenItsContextEndsThoughAChildHoldsItsOutput: an nft that is a
// wrapper (a shell script that runs the binary as its child, not with exec) and
// hangs is killed when the context ends, but its child keeps the output pipe
// open; run still returns within RunWaitDelay of the end, with an error saying
// the context ended, rather than waiting for the child.
func TestRunReturnsWhenItsContextEndsThoughAChildHoldsItsOutput(t *testing.T) {
	b := &Backend{nft: "/bin/sh", groups: testGroups, applyVia: applyExec}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	// The child outlives the test's bound below, then exits by itself.
	go func() { _, err := b.run(ctx, "", "-c", "sleep 30 & wait"); errc <- err }()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("an nft killed at its context's end: %v, want an error saying the context ended", err)
		}
		if took := time.Since(start); took > 100*time.Millisecond+RunWaitDelay+time.Second {
			t.Errorf("run took %v, want at most the context's 100ms and RunWaitDelay (%v)", took, RunWaitDelay)
		}
	case <-time.After(100*time.Millisecond + RunWaitDelay + 5*time.Second):
		t.Fatal("run still waits for the killed nft's child, which holds its output")
	}
}

// TestARollbackWritesBackTheTablesItFound: the rollback of an apply that
// replaced our tables (capture.Apply runs it when the routing fails after the
// rules went in) writes the tables the apply found back as they were, for every
// case and both write paths: nft lists the ruleset as it listed it before the
// apply, so every rule this backend writes reads back into one it writes again.
// Where the apply found none of our tables, it deletes the apply's. Tables that
// hold what this backend does not write (here a named set someone added) cannot
// be written back: the rollback says so, naming it, and leaves the apply's
// tables, a whole capture, rather than none.
func TestARollbackWritesBackTheTablesItFound(t *testing.T) {
	ctx := context.Background()
	other := specCase{"other", func(s *redirect.Spec) { s.InboundPortsExclude = []uint16{9}; s.OutboundPortsExclude = []uint16{9} }}
	applyAndRollBack := func(t *testing.T, ns string, b *Backend, plan *redirect.Plan) error {
		t.Helper()
		var rerr error
		in(t, ns, func() error {
			changed, rollback, release, err := b.ApplyWithRollback(ctx, plan)
			defer release()
			if err != nil || !changed {
				t.Fatalf("ApplyWithRollback: changed %v, %v; want a change", changed, err)
			}
			rerr = rollback(ctx)
			return nil
		})
		return rerr
	}
	for _, tb := range testBackends() {
		for _, c := range specCases {
			t.Run(tb.name+"/"+c.name, func(t *testing.T) {
				ns := testNS(t)
				empty := command(t, ns, "", "nft", "list", "ruleset")
				if err := applyAndRollBack(t, ns, tb.b, c.plan(t)); err != nil {
					t.Fatalf("rollback in a namespace without our tables: %v", err)
				}
				if got := command(t, ns, "", "nft", "list", "ruleset"); got != empty {
					t.Errorf("after the rollback in a namespace without our tables, nft lists:\n%s", got)
				}
				in(t, ns, func() error { _, err := tb.b.Apply(ctx, c.plan(t)); return err })
				before := command(t, ns, "", "nft", "list", "ruleset")
				if err := applyAndRollBack(t, ns, tb.b, other.plan(t)); err != nil {
					t.Fatalf("rollback: %v", err)
				}
				if diff := cmp.Diff(before, command(t, ns, "", "nft", "list", "ruleset")); diff != "" {
					t.Errorf("after the rollback the ruleset differs from what the apply found (-found +after):\n%s", diff)
				}
			})
		}
		t.Run(tb.name+"/a named set in our table", func(t *testing.T) {
			ns := testNS(t)
			in(t, ns, func() error { _, err := tb.b.Apply(ctx, specCases[0].plan(t)); return err })
			command(t, ns, "", "nft", "add", "set", "ip", TablePrefix+"nat", "added", "{ type ipv4_addr; }")
			err := applyAndRollBack(t, ns, tb.b, other.plan(t))
			if err == nil || !strings.Contains(err.Error(), `table ip istio-proxy-nat holds the set "added"`) {
				t.Errorf("rollback: %v; want it refused, naming the set", err)
			}
			var d []string
			in(t, ns, func() (err error) { d, err = tb.b.Verify(ctx, other.plan(t)); return err })
			if len(d) > 0 {
				t.Errorf("after the refused rollback Verify of the apply's plan: %q; want its tables whole", d)
			}
		})
	}
}
