package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// TestARollbackPutsEveryRuleBackInItsPlace: an apply whose restore commits
// mangle and is refused at nat (an owner group the node does not know) puts
// mangle back exactly as it found it, in both modes: our chains with their rules,
// and in the built-in chains our jumps and Istio's own rules (a namespace Istio's
// istio-iptables programmed: the upgrade to this plugin, istio-iptables run
// again) each in its place among everyone else's rules, which the apply did not
// touch. The apply had deleted them and inserted its jumps first in each chain;
// before, the rollback removed all of ours and Istio's rules besides, and left
// only the others'.
func TestARollbackPutsEveryRuleBackInItsPlace(t *testing.T) {
	root.Require(t)
	failing := specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldInboundPortsExclude: "9090",
		redirect.FieldOutboundCIDRs: "*", redirect.FieldOwnerGroupsInclude: "no-such-group-x"}.Plan(t)
	cases := []struct {
		name  string
		setup func(t *testing.T, ns string, m Mode, b *Backend)
	}{
		{"Istio's layout beside others' rules", func(t *testing.T, ns string, m Mode, _ *Backend) {
			restoreIn(t, ns, "iptables-"+string(m)+"-restore", istioTProxySave)
		}},
		{"our capture with others' rules before and after its jumps", func(t *testing.T, ns string, m Mode, b *Backend) {
			if _, err := capture.Apply(context.Background(), ns, b, backendCases[1].opts.Plan(t)); err != nil {
				t.Fatal(err)
			}
			for _, ipt := range []string{"iptables-" + string(m), "ip6tables-" + string(m)} {
				runIn(t, ns, ipt, "-t", "mangle", "-I", "PREROUTING", "1", "-i", "eth7", "-j", "ACCEPT")
				runIn(t, ns, ipt, "-t", "mangle", "-A", "PREROUTING", "-i", "eth8", "-j", "ACCEPT")
				runIn(t, ns, ipt, "-t", "mangle", "-I", "OUTPUT", "1", "-o", "eth7", "-j", "RETURN")
			}
		}},
	}
	for _, m := range modes(t) {
		for _, c := range cases {
			t.Run(string(m)+"/"+c.name, func(t *testing.T) {
				b := lockingBackend(t, m, t.TempDir())
				ns := newNS(t)
				c.setup(t, ns, m, b)
				before := savedInBoth(t, ns, m)
				if _, err := capture.Apply(context.Background(), ns, b, failing); err == nil || !strings.Contains(err.Error(), "no-such-group-x") {
					t.Fatalf("Apply: %v; want it refused at the unknown owner group no-such-group-x", err)
				}
				if after := savedInBoth(t, ns, m); after != before {
					t.Errorf("after the failed apply the namespace holds:\n%s\nwant what it held before:\n%s", after, before)
				}
			})
		}
	}
}
