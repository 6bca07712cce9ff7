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
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestFailedApplyLeavesNothing: when the rules cannot be applied (here an owner group
// that does not exist on the node, which the kernel-side tools refuse), Apply fails
// and removes what it had added (what a restore wrote before it failed), and adds
// no TPROXY routing nor IPv6 passthrough address: a namespace is never left
// half-captured. The same for a pod with hostUsers: false, whose iptables tools
// run in its user namespace. The rules are read with the backend's own tools
// (liveRules).
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
				for what, out := range leftovers(t, ns, name, []string{"ip", "rule"}, []string{"ip", "-6", "addr", "show", "dev", "lo"}) {
					for _, leftover := range []string{"ISTIO_", "istio-proxy", "lookup 133", "::6/128"} {
						if strings.Contains(out, leftover) {
							t.Errorf("after a failed apply, %s shows %q:\n%s", what, leftover, out)
						}
					}
				}
			})
		}
	}
}

// TestAFailedApplyLeavesANewNamespaceAsItWas: in a pod's new namespace every
// backend writes its rules (iptables-nft natively), and the IPv6 passthrough
// address is refused (the pod's IPv6 is off): the rollback removes the rules, and
// the namespace's rules are what they were before the apply, none of ours.
func TestAFailedApplyLeavesANewNamespaceAsItWas(t *testing.T) {
	root.Require(t)
	plan := specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"}).Plan(t)
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ns := ipv6OffNamespace(t)
			before := liveRules(t, ns, name)
			if _, err := capture.Apply(context.Background(), ns, b, plan); err == nil || !strings.Contains(err.Error(), "add ::6/128 to lo") {
				t.Fatalf("Apply: %v; want the IPv6 passthrough address refused", err)
			}
			if after := liveRules(t, ns, name); after != before || strings.Contains(after, "ISTIO_") {
				t.Errorf("after the failed apply the rules are:\n%s\nwant them as before it:\n%s", after, before)
			}
		})
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
	hangIP6TablesLegacyRestore(t)
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
			for what, out := range leftovers(t, ns, b.Name(), []string{"ip", "rule"}, []string{"ip", "-6", "rule"}, []string{"ip", "-6", "addr", "show", "dev", "lo"}) {
				for _, leftover := range []string{"ISTIO_", "lookup 133", "::6/128"} {
					if strings.Contains(out, leftover) {
						t.Errorf("after an apply cut off by its bound, %s shows %q:\n%s", what, leftover, out)
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
// it added, its rules too (read with the backend's own tools, liveRules), and
// nothing else: IPv4's rule, when it was there before the apply started, stays.
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
				ns := ipv6OffNamespace(t)
				for _, cmd := range c.setup {
					testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
				}
				_, err := capture.Apply(context.Background(), ns, b, plan)
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
				for what, out := range leftovers(t, ns, name, []string{"ip", "route", "show", "table", "all"}) {
					for _, leftover := range []string{"ISTIO_", "table 133"} {
						if strings.Contains(out, leftover) {
							t.Errorf("after the failed apply, %s shows %q:\n%s", what, leftover, out)
						}
					}
				}
			})
		}
	}
}

// hangIP6TablesLegacyRestore puts an ip6tables-legacy-restore that never ends
// (but answers --version) first in PATH, for the backends made after it: an
// apply's IPv6 restore then runs until its bound kills it, after IPv4's rules
// are in.
func hangIP6TablesLegacyRestore(t *testing.T) {
	t.Helper()
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
}

// liveRules is the rules of the namespace ns as the tools of backend (a name of
// backendFactories) print them: both families' save tools of its mode, the ones
// the backend itself runs (iptables.NodeTools; rulestext.Saved), or nft's
// listing of the ruleset. Not the plain iptables-save: that is whichever
// variant the node's alternatives chose (here the nft one), and it does not
// see the other variant's tables, so a check of a legacy backend's rules with
// it could not fail.
func liveRules(t *testing.T, ns, backend string) string {
	t.Helper()
	if mode, ok := strings.CutPrefix(backend, "iptables-"); ok {
		tools, err := iptables.NodeTools(iptables.NodeView{Root: "/"}, iptables.Mode(mode))
		if err != nil {
			t.Fatalf("the tools of %s: %v", backend, err)
		}
		return rulestext.Saved(testns.Run(t, ns, exec.Command(tools.Save[redirect.IPv4]))) + "\n" +
			rulestext.Saved(testns.Run(t, ns, exec.Command(tools.Save[redirect.IPv6])))
	}
	return testns.Run(t, ns, exec.Command("nft", "list", "ruleset"))
}

// leftovers is what a check for rules and routing left behind in the namespace
// ns reads, by what it ran: the rules as backend's tools print them (liveRules)
// and the output of each command of routing.
func leftovers(t *testing.T, ns, backend string, routing ...[]string) map[string]string {
	t.Helper()
	out := map[string]string{"the rules (" + backend + "'s tools)": liveRules(t, ns, backend)}
	for _, cmd := range routing {
		out[strings.Join(cmd, " ")] = testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...))
	}
	return out
}

// liveRouting is capture.RoutingOf without the tentative flag of ::6, which
// changes by itself (lo skips the kernel's DAD work, which clears it).
func liveRouting(t *testing.T, ns string) string {
	return strings.ReplaceAll(capture.RoutingOf(t, ns), " tentative", "")
}

// wantCaptureAsBefore fails t unless, after a failed apply, the pod of tp holds
// the rules and routing it held before it (rules, routing: liveRules and
// liveRouting of backend), its capture verifies as plan's, and flows land where
// plan says (none are sent when flows is nil).
func wantCaptureAsBefore(t *testing.T, tp *sandbox.Topology, b capture.Backend, backend string, plan *redirect.Plan, flows []flow, rules, routing string) {
	t.Helper()
	if after := liveRules(t, tp.Pod, backend); after != rules {
		t.Errorf("after the failed apply the rules are:\n%s\nwant them as the first apply left them:\n%s", after, rules)
	}
	if after := liveRouting(t, tp.Pod); after != routing {
		t.Errorf("after the failed apply the routing is:\n%s\nwant it as the first apply left it:\n%s", after, routing)
	}
	if diffs, err := capture.Verify(context.Background(), tp.Pod, b, plan); err != nil || len(diffs) > 0 {
		t.Errorf("Verify after the failed apply: %q, %v; want the first apply's capture whole", diffs, err)
	}
	sendFlows(t, tp, flows)
}

// TestAFailedApplyPutsBackTheCaptureItFound: a pod's capture is in place (its
// ADD's), and another apply to its namespace with another plan (the agent's
// repair in place after the pod's annotations changed, a retried ADD,
// istio-iptables run again) fails after it wrote rules. Its rollback puts back
// the rules it found: after it the pod's rules are exactly the first apply's
// (the live rules text), its routing too, its capture verifies whole, and its
// traffic lands where the first plan says, the connections only TPROXY's policy
// routing delivers included. The rollback removed every rule of ours: the pod
// was left with no capture at all while its ADD had reported success. The
// second apply fails as it does for real: the iptables backends' restore
// commits mangle (the second plan's TPROXY rules, port 9090 excluded now) and is
// refused at nat, which holds an owner group the node does not know; the
// nftables backends refuse that group before their transaction, all or nothing,
// and so leave the first apply's tables as they were. Or every backend writes
// both families' rules (IPv6's tables are new) and the pod's IPv6, switched off,
// refuses the IPv6 route: the nftables backends' rollback deleted their tables,
// the first apply's among them. The first case also for a pod with hostUsers:
// false, whose iptables tools (the rollback's too) run in its user namespace;
// no traffic is sent there (the flows' uids are the node's).
func TestAFailedApplyPutsBackTheCaptureItFound(t *testing.T) {
	root.Require(t)
	byName := func(name string) trafficCase {
		return trafficCases[slices.IndexFunc(trafficCases, func(tc trafficCase) bool { return tc.name == name })]
	}
	dual, tproxy := byName("TPROXY with exclusions, loopback and IPv6"), byName("TPROXY inbound")
	partWay := dual.opts.With(specs.Settings{redirect.FieldInboundPortsExclude: "15021,9090", redirect.FieldOwnerGroupsInclude: "no-such-group-x"})
	cases := []struct {
		name    string
		first   trafficCase
		second  specs.Settings
		userNS  bool   // the pod's namespace is a hostUsers: false pod's
		ipv6Off bool   // the pod's IPv6 is off
		refusal string // what the second apply's error says
	}{
		{name: "rules refused part-way", first: dual, second: partWay, refusal: "no-such-group-x"},
		{name: "rules refused part-way, hostUsers false", first: dual, second: partWay, userNS: true, refusal: "no-such-group-x"},
		{
			name: "routing refused after the rules", first: tproxy, ipv6Off: true,
			second:  tproxy.opts.With(specs.Settings{redirect.FieldInboundPortsExclude: "9090", redirect.FieldIPv6: "true"}),
			refusal: "add local default route to table 133 (family 10)",
		},
	}
	for name, b := range backends(t) {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				newSandbox := sandbox.New
				if c.userNS {
					newSandbox = func(dir, prefix string) (*sandbox.Topology, error) { return sandbox.NewUserNamespaced(t, dir, prefix) }
				}
				tp, err := newSandbox(t.TempDir(), "")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tp.Close() })
				if c.ipv6Off {
					testns.Run(t, tp.Pod, exec.Command("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"))
				}
				flows := c.first.flows
				if c.userNS {
					flows = nil
				} else {
					serveFlows(t, tp, true)
				}
				plan := c.first.opts.Plan(t)
				if _, err := capture.Apply(context.Background(), tp.Pod, b, plan); err != nil {
					t.Fatal(err)
				}
				rules, routing := liveRules(t, tp.Pod, name), liveRouting(t, tp.Pod)
				if _, err := capture.Apply(context.Background(), tp.Pod, b, c.second.Plan(t)); err == nil || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("the second Apply: %v; want it refused (%s)", err, c.refusal)
				}
				wantCaptureAsBefore(t, tp, b, name, plan, flows, rules, routing)
			})
		}
	}
}

// TestAnApplyCutOffByItsBoundPutsBackTheCaptureItFound: a pod's capture is in
// place (dual stack, TPROXY), and a second apply with another plan is cut off
// by its bound mid-way (ip6tables-legacy-restore hangs, after the second plan's
// IPv4 rules are in). Its rollback, under a bound of its own, puts IPv4's rules
// back as the first apply left them, and leaves IPv6's, which the killed restore
// did not write: the pod's rules and routing are the first apply's, its capture
// verifies whole and its traffic lands where the first plan says. The rollback
// removed every rule of ours, both families', and left the pod with no capture.
func TestAnApplyCutOffByItsBoundPutsBackTheCaptureItFound(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	first, err := iptables.NewBackend(iptables.Config{Mode: iptables.ModeLegacy, LockDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	hangIP6TablesLegacyRestore(t)
	cut, err := iptables.NewBackend(iptables.Config{Mode: iptables.ModeLegacy, LockDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	tc := trafficCases[slices.IndexFunc(trafficCases, func(tc trafficCase) bool { return tc.name == "TPROXY with exclusions, loopback and IPv6" })]
	tp, err := sandbox.New(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	serveFlows(t, tp, true)
	plan := tc.opts.Plan(t)
	if _, err := capture.Apply(context.Background(), tp.Pod, first, plan); err != nil {
		t.Fatal(err)
	}
	rules, routing := liveRules(t, tp.Pod, "iptables-legacy"), liveRouting(t, tp.Pod)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	second := tc.opts.With(specs.Settings{redirect.FieldInboundPortsExclude: "15021,9090"}).Plan(t)
	if _, err := capture.Apply(ctx, tp.Pod, cut, second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the second Apply: %v; want it stopped by its bound", err)
	}
	wantCaptureAsBefore(t, tp, first, "iptables-legacy", plan, tc.flows, rules, routing)
}
