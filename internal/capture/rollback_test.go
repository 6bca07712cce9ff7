package capture_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestFailedApplyLeavesNothing: when the rules cannot be applied (here an owner group
// that does not exist on the node, which the kernel-side tools refuse) after the
// TPROXY routing and the IPv6 passthrough address were set up, Apply fails and
// removes what it had added: a namespace is never left half-captured. The same
// for a pod with hostUsers: false, whose iptables tools run in its user namespace.
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
