package capture

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestCleanupRemovesOnlyTheRoutingThatIsThere: a DEL cleans up with the default
// plan (TPROXY routing and the IPv6 passthrough address), whatever the pod had. It
// removes exactly what is in the namespace, including what a partial earlier
// cleanup left, and for a pod that had none of it (the common REDIRECT pod)
// removes nothing: no routing change, so no wait on the kernel's routing lock.
func TestCleanupRemovesOnlyTheRoutingThatIsThere(t *testing.T) {
	root.Require(t)
	tproxy := specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*"}
	cases := []struct {
		name  string
		plan  *redirect.Plan // applied first, when not nil
		setup [][]string     // commands run in the namespace before the cleanup
		want  []string       // what Cleanup says it removed
		keep  []string       // what must still be there after it
	}{
		{name: "REDIRECT, IPv4", plan: specs.Settings{}.Plan(t)},
		{name: "REDIRECT, dual stack", plan: specs.Settings{redirect.FieldIPv6: "true"}.Plan(t),
			want: []string{"address ::6/128 on lo"}},
		{name: "TPROXY, IPv4", plan: tproxy.Plan(t), want: []string{
			"rule fwmark 1337 lookup 133 (family 2)", "local default route of table 133 (family 2)"}},
		{name: "TPROXY, dual stack", plan: specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldIPv6: "true"}.Plan(t),
			want: []string{"address ::6/128 on lo",
				"rule fwmark 1337 lookup 133 (family 2)", "local default route of table 133 (family 2)",
				"rule fwmark 1337 lookup 133 (family 10)", "local default route of table 133 (family 10)"}},
		{name: "what a partial cleanup left: routes and the address, no rule", setup: [][]string{
			{"ip", "route", "add", "local", "default", "dev", "lo", "table", "133"},
			{"ip", "-6", "route", "add", "local", "default", "dev", "lo", "table", "133"},
			{"ip", "-6", "addr", "add", "::6/128", "dev", "lo"},
		}, want: []string{"address ::6/128 on lo", "local default route of table 133 (family 2)", "local default route of table 133 (family 10)"}},
		{name: "a rule twice, no route", setup: [][]string{
			{"ip", "rule", "add", "fwmark", "1337", "lookup", "133"},
			{"ip", "rule", "add", "fwmark", "1337", "lookup", "133"},
		}, want: []string{"rule fwmark 1337 lookup 133 (family 2)", "rule fwmark 1337 lookup 133 (family 2)"}},
		{name: "IPv6 off in the namespace", setup: [][]string{{"sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"}}},
		{name: "another program's routing is kept", setup: [][]string{
			{"ip", "route", "add", "10.9.0.0/16", "dev", "lo", "table", "133"},
			{"ip", "rule", "add", "fwmark", "7", "lookup", "133"},
			{"ip", "-6", "addr", "add", "::7/128", "dev", "lo", "nodad"}, // nodad: a tentative address changes its flags under the test
		}, keep: []string{"10.9.0.0/16", "fwmark 0x7", "::7/128"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := testns.New(t.TempDir(), "ns")
			if err != nil {
				t.Fatal(err)
			}
			defer testns.Delete(ns)
			testns.Run(t, ns, exec.Command("ip", "link", "set", "lo", "up"))
			b := nftables.NewBackend()
			if tc.plan != nil {
				if _, err := Apply(context.Background(), ns, b, tc.plan); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range tc.setup {
				testns.Run(t, ns, exec.Command(c[0], c[1:]...))
			}
			before := routingOf(t, ns)
			got, tried, err := cleanup(context.Background(), ns, b, nil)
			if tried != len(tc.want) {
				t.Errorf("Cleanup tried %d routing deletions, want %d: one per entry there, none for what is not", tried, len(tc.want))
			}
			if err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("removed (-want +got):\n%s", diff)
			}
			after := routingOf(t, ns)
			for _, line := range strings.Split(after, "\n") {
				for _, ours := range []string{"fwmark 0x539", "local default", "::6/128"} {
					if strings.Contains(line, ours) {
						t.Errorf("after Cleanup the namespace still has %q", line)
					}
				}
			}
			if len(tc.want) == 0 && before != after {
				t.Errorf("Cleanup removed nothing, but the routing changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			for _, keep := range tc.keep {
				if !strings.Contains(after, keep) {
					t.Errorf("Cleanup removed another program's %q:\n%s", keep, after)
				}
			}
		})
	}
}

// routingOf is the namespace's policy rules, lo's addresses and table 133's
// routes, in both families, as ip prints them.
func routingOf(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][]string{{"ip", "rule"}, {"ip", "-6", "rule"}, {"ip", "addr", "show", "dev", "lo"}} {
		b.WriteString(testns.Run(t, ns, exec.Command(c[0], c[1:]...)))
	}
	// "show table 133" fails while the table does not exist: list all, keep 133's.
	for _, c := range [][]string{{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"}} {
		for line := range strings.Lines(testns.Run(t, ns, exec.Command(c[0], c[1:]...))) {
			if strings.Contains(line, "table 133") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// TestForeignRuleLikeOursIsNotOurs: a policy rule of another program with our
// mark and table but something more or different (inverted, an input interface,
// a mark mask, a source, an action other than the lookup) is not ours: Apply adds
// ours beside it, CHECK (Verify) misses ours when only the foreign one is left,
// and Cleanup deletes ours and leaves the foreign one.
func TestForeignRuleLikeOursIsNotOurs(t *testing.T) {
	root.Require(t)
	plan := specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldIPv6: "true"}.Plan(t)
	cases := []struct {
		name    string
		foreign []string // ip arguments adding the foreign rule
		shows   string   // how ip rule prints it
	}{
		{"inverted", []string{"rule", "add", "not", "fwmark", "1337", "lookup", "133"}, "not from all fwmark 0x539 lookup 133"},
		{"an input interface", []string{"rule", "add", "fwmark", "1337", "iif", "eth9", "lookup", "133"}, "fwmark 0x539 iif eth9"},
		{"an output interface", []string{"rule", "add", "fwmark", "1337", "oif", "eth9", "lookup", "133"}, "fwmark 0x539 oif eth9"},
		{"a mark mask", []string{"rule", "add", "fwmark", "1337/0xff", "lookup", "133"}, "fwmark 0x539/0xff lookup 133"},
		{"a source", []string{"rule", "add", "from", "10.0.0.0/8", "fwmark", "1337", "lookup", "133"}, "from 10.0.0.0/8 fwmark 0x539 lookup 133"},
		{"a tos", []string{"rule", "add", "tos", "0x10", "fwmark", "1337", "lookup", "133"}, "tos 0x10 fwmark 0x539 lookup 133"},
		{"a uid range", []string{"rule", "add", "uidrange", "1-2", "fwmark", "1337", "lookup", "133"}, "fwmark 0x539 uidrange 1-2 lookup 133"},
		{"a prohibit action", []string{"rule", "add", "fwmark", "1337", "table", "133", "prohibit"}, "fwmark 0x539 lookup 133 prohibit"},
		{"IPv6, an input interface", []string{"-6", "rule", "add", "fwmark", "1337", "iif", "eth9", "lookup", "133"}, "fwmark 0x539 iif eth9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := testns.New(t.TempDir(), "ns")
			if err != nil {
				t.Fatal(err)
			}
			defer testns.Delete(ns)
			testns.Run(t, ns, exec.Command("ip", "link", "set", "lo", "up"))
			testns.Run(t, ns, exec.Command("ip", tc.foreign...))
			if !strings.Contains(routingOf(t, ns), tc.shows) {
				t.Fatalf("the foreign rule does not show as %q:\n%s", tc.shows, routingOf(t, ns))
			}
			b := nftables.NewBackend()
			if _, err := Apply(context.Background(), ns, b, plan); err != nil {
				t.Fatal(err)
			}
			fam := []string{}
			if tc.foreign[0] == "-6" {
				fam = []string{"-6"}
			}
			ours := oursIn(testns.Run(t, ns, exec.Command("ip", append(fam, "rule")...)))
			if len(ours) != 1 {
				t.Fatalf("after Apply, %d rules exactly ours (want 1) beside the foreign one:\n%s", len(ours), routingOf(t, ns))
			}
			if d, err := Verify(context.Background(), ns, b, plan); err != nil || len(d) > 0 {
				t.Fatalf("Verify after Apply: %v %q", err, d)
			}
			// Only the foreign rule left: CHECK must see ours missing.
			testns.Run(t, ns, exec.Command("ip", append(fam, "rule", "del", "pref", ours[0])...))
			d, err := Verify(context.Background(), ns, b, plan)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(d, func(s string) bool { return strings.Contains(s, "policy rule fwmark 1337 lookup 133 missing") }) {
				t.Errorf("Verify with only the foreign rule left reports %q, want our rule missing", d)
			}
			if _, err := Apply(context.Background(), ns, b, plan); err != nil {
				t.Fatal(err)
			}
			if _, err := Cleanup(context.Background(), ns, b, plan); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			after := routingOf(t, ns)
			if !strings.Contains(after, tc.shows) {
				t.Errorf("Cleanup removed the foreign rule %q:\n%s", tc.shows, after)
			}
			if got := oursIn(after); len(got) > 0 {
				t.Errorf("after Cleanup, rules of ours at priorities %v:\n%s", got, after)
			}
		})
	}
}

// TestCleanupRefusesToDeleteAForeignRuleFirstAtOurPriority: the kernel deletes
// the first rule that matches what a deletion names, reading what it leaves out
// as wildcards; a foreign rule at our priority with our mark and table, before
// ours, would be that rule. Cleanup then deletes nothing and says why.
func TestCleanupRefusesToDeleteAForeignRuleFirstAtOurPriority(t *testing.T) {
	root.Require(t)
	ns, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	defer testns.Delete(ns)
	testns.Run(t, ns, exec.Command("ip", "rule", "add", "pref", "100", "fwmark", "1337", "iif", "eth9", "lookup", "133"))
	testns.Run(t, ns, exec.Command("ip", "rule", "add", "pref", "100", "fwmark", "1337", "lookup", "133"))
	_, err = Cleanup(context.Background(), ns, nftables.NewBackend(), nil)
	if err == nil || !strings.Contains(err.Error(), "another rule at that priority") {
		t.Errorf("Cleanup: %v, want a refusal naming the foreign rule", err)
	}
	if after := routingOf(t, ns); !strings.Contains(after, "100:\tfrom all fwmark 0x539 iif eth9 [detached] lookup 133") {
		t.Errorf("the foreign rule is gone:\n%s", after)
	}
}

// oursIn lists the priorities of the rules in ip's listing that are exactly
// "from all fwmark 0x539 lookup 133".
func oursIn(listing string) []string {
	var prios []string
	for line := range strings.Lines(listing) {
		prio, rule, ok := strings.Cut(strings.TrimSpace(line), ":\t")
		if ok && rule == "from all fwmark 0x539 lookup 133" {
			prios = append(prios, prio)
		}
	}
	return prios
}
