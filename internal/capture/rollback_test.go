package capture_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestFailedApplyLeavesNothing: when the rules cannot be applied (here an owner group
// that does not exist on the node, which the kernel-side tools refuse), Apply fails
// and removes what it had added (what a restore wrote before it failed), and adds
// no TPROXY routing nor IPv6 passthrough address: a namespace is never left
// half-captured. The same for a pod with hostUsers: false, whose iptables tools
// run in its user namespace.
func TestFailedApplyLeavesNothing(t *testing.T) {
	root.Require(t)
	plan := specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldOwnerGroupsInclude: "no-such-group-x", redirect.FieldIPv6: "true"}.Plan(t)
	pods := []struct {
		name  string
		netns func(t *testing.T) string
	}{
		{"node's user namespace", func(t *testing.T) string {
			ns, err := testns.New(t.TempDir(), "ns")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { testns.Delete(ns) })
			return ns
		}},
		{"hostUsers false", func(t *testing.T) string { return testns.NewInUserNamespace(t) }},
	}
	for name, b := range backends(t) {
		for _, pod := range pods {
			t.Run(name+"/"+pod.name, func(t *testing.T) {
				ns := pod.netns(t)
				_, err := capture.Apply(context.Background(), ns, b, plan)
				if err == nil {
					t.Fatal("Apply succeeded with an unknown owner group")
				}
				if !strings.Contains(err.Error(), "no-such-group-x") {
					t.Errorf("Apply: %v; want it refused at the unknown owner group no-such-group-x", err)
				}
				for _, cmd := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}, {"ip", "rule"}, {"ip", "-6", "addr", "show", "dev", "lo"}} {
					out := testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
					for _, leftover := range []string{"ISTIO_", "istio-proxy", "lookup 133", "::6/128"} {
						if strings.Contains(out, leftover) {
							t.Errorf("after a failed apply, %v shows %q:\n%s", cmd, leftover, out)
						}
					}
				}
			})
		}
	}
}

// TestApplyCutOffByItsBoundLeavesNothing: an apply whose command's bound runs out
// mid-way (here ip6tables-legacy-restore hangs, after IPv4's rules are in) fails,
// and what it had added is still removed: the removal has a bound of its own
// (capture.RollbackBound), since the command's has no time left (before, the
// removal's iptables-save was refused at once and IPv4's rules stayed). The same
// for a pod with hostUsers: false, whose tools run in its user namespace.
func TestApplyCutOffByItsBoundLeavesNothing(t *testing.T) {
	root.Require(t)
	real, err := exec.LookPath("ip6tables-legacy-restore")
	if err != nil {
		t.Fatalf("ip6tables-legacy-restore not installed: %v", err)
	}
	bin := t.TempDir()
	script := "#!/bin/sh\n" +
		"case \"$1\" in --version|-V) exec " + real + " \"$@\";; esac\n" +
		"exec sleep 60\n"
	if err := os.WriteFile(filepath.Join(bin, "ip6tables-legacy-restore"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	b, err := iptables.NewBackend(iptables.Config{Mode: iptables.ModeLegacy, LockDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	plan := specs.Sidecar().With(specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldIPv6: "true"}).Plan(t)
	pods := map[string]func(t *testing.T) string{
		"node's user namespace": func(t *testing.T) string {
			ns, err := testns.New(t.TempDir(), "ns")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { testns.Delete(ns) })
			return ns
		},
		"hostUsers false": func(t *testing.T) string { return testns.NewInUserNamespace(t) },
	}
	for name, newNS := range pods {
		t.Run(name, func(t *testing.T) {
			ns := newNS(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := capture.Apply(ctx, ns, b, plan)
			if err == nil {
				t.Fatal("Apply succeeded with an ip6tables-restore that never ends")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Apply: %v; want it stopped by its bound", err)
			}
			for _, cmd := range [][]string{{"iptables-legacy-save"}, {"ip", "rule"}, {"ip", "-6", "rule"}, {"ip", "-6", "addr", "show", "dev", "lo"}} {
				out := testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
				for _, leftover := range []string{"ISTIO_", "lookup 133", "::6/128"} {
					if strings.Contains(out, leftover) {
						t.Errorf("after an apply cut off by its bound, %v shows %q:\n%s", cmd, leftover, out)
					}
				}
			}
		})
	}
}

// TestAFailedApplyLeavesTheCaptureItFoundInPlace: a pod's capture is in place
// (its ADD's: dual stack, REDIRECT or TPROXY), and another apply to its
// namespace (the agent's repair in place, a retried ADD) fails before it writes
// a rule. It leaves that capture whole: the rules, and TPROXY's policy routing
// and IPv6's passthrough address, which it found there and did not add; the
// pod's traffic still lands where the plan says, the connections only the
// policy routing delivers too. Its rollback removed the routing and the
// address, and those connections were dropped. Each backend fails as it does
// for real: the iptables ones at their first read, their bound run out (as it
// runs out while another apply holds the namespace's apply lock), the nftables
// ones at an owner group the node does not know, refused before their
// transaction.
func TestAFailedApplyLeavesTheCaptureItFoundInPlace(t *testing.T) {
	root.Require(t)
	for _, caseName := range []string{"IPv6", "TPROXY with exclusions, loopback and IPv6"} {
		tc := trafficCases[slices.IndexFunc(trafficCases, func(tc trafficCase) bool { return tc.name == caseName })]
		plan := tc.opts.Plan(t)
		for name, b := range backends(t) {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				tp, err := sandbox.New(t.TempDir(), "")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tp.Close() })
				serveFlows(t, tp, tc.opts[redirect.FieldMode] == "TPROXY")
				if _, err := capture.Apply(context.Background(), tp.Pod, b, plan); err != nil {
					t.Fatal(err)
				}
				// ::6 shows as tentative until the kernel's DAD work, which lo
				// skips, has run: a flag that changes by itself.
				routing := func() string { return strings.ReplaceAll(capture.RoutingOf(t, tp.Pod), " tentative", "") }
				before := routing()
				ctx, second, refusal := context.Background(), plan, "context deadline exceeded"
				if strings.HasPrefix(name, "iptables") {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, time.Now())
					defer cancel()
				} else {
					second = tc.opts.With(specs.Settings{redirect.FieldOwnerGroupsInclude: "no-such-group-x"}).Plan(t)
					refusal = "no-such-group-x"
				}
				if _, err := capture.Apply(ctx, tp.Pod, b, second); err == nil || !strings.Contains(err.Error(), refusal) {
					t.Fatalf("the second Apply: %v; want it refused (%s) before it writes a rule", err, refusal)
				}
				if after := routing(); after != before {
					t.Errorf("after the failed apply the routing is:\n%s\nwant it as the first apply left it:\n%s", after, before)
				}
				if diffs, err := capture.Verify(context.Background(), tp.Pod, b, plan); err != nil || len(diffs) > 0 {
					t.Errorf("Verify after the failed apply: %q, %v; want the first apply's capture whole", diffs, err)
				}
				sendFlows(t, tp, tc.flows)
			})
		}
	}
}

// TestAFailedApplyRemovesTheRoutingItAdded: an apply that fails after it added
// routing (here a dual-stack TPROXY plan in a namespace with IPv6 off: its
// rules and IPv4's route and rule go in, IPv6's route is refused) removes what
// it added, its rules too, and nothing else: IPv4's rule, when it was there
// before the apply started, stays.
func TestAFailedApplyRemovesTheRoutingItAdded(t *testing.T) {
	root.Require(t)
	plan := specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldIPv6: "true"}.Plan(t)
	cases := []struct {
		name  string
		setup [][]string // run in the new namespace before the apply
		keep  string     // what ip rule must still show after it
	}{
		{name: "a new namespace"},
		{name: "IPv4's rule there before", setup: [][]string{{"ip", "rule", "add", "fwmark", "1337", "lookup", "133"}}, keep: "from all fwmark 0x539 lookup 133"},
	}
	for name, b := range backends(t) {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				ns, err := testns.New(t.TempDir(), "ns")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { testns.Delete(ns) })
				testns.Run(t, ns, exec.Command("ip", "link", "set", "lo", "up"))
				testns.Run(t, ns, exec.Command("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"))
				for _, cmd := range c.setup {
					testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
				}
				_, err = capture.Apply(context.Background(), ns, b, plan)
				if err == nil || !strings.Contains(err.Error(), "add local default route to table 133 (family 10)") {
					t.Fatalf("Apply: %v; want IPv6's route refused", err)
				}
				rules := testns.Run(t, ns, exec.Command("ip", "rule"))
				if c.keep != "" && !strings.Contains(rules, c.keep) {
					t.Errorf("the failed apply removed %q, there before it:\n%s", c.keep, rules)
				}
				if c.keep == "" && strings.Contains(rules, "lookup 133") {
					t.Errorf("the failed apply left its rule:\n%s", rules)
				}
				for _, cmd := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}, {"ip", "route", "show", "table", "all"}} {
					out := testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
					for _, leftover := range []string{"ISTIO_", "table 133"} {
						if strings.Contains(out, leftover) {
							t.Errorf("after the failed apply, %v shows %q:\n%s", cmd, leftover, out)
						}
					}
				}
			})
		}
	}
}
