package capture

import (
	"context"
	"os/exec"
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
