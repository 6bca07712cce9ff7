package capture_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
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
