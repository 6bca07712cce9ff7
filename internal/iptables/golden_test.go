package iptables

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// renderCases name the specs whose renderings are kept as golden files.
var renderCases = []struct {
	name string
	opts specs.Settings
}{
	{"default-sidecar", specs.Sidecar()},
	{"inbound-ports", specs.Settings{redirect.FieldInboundPorts: "80,443", redirect.FieldOutboundCIDRs: "10.0.0.0/8,172.16.0.0/12"}},
	{"exclusions", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldInboundPortsExclude: "22", redirect.FieldOutboundCIDRs: "*", redirect.FieldOutboundCIDRsExclude: "169.254.169.254/32,10.1.0.0/16", redirect.FieldOutboundPortsExclude: "5432,6379", redirect.FieldExcludeInterfaces: "eth1"}},
	{"virtual-interfaces", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldRerouteVirtualInterfaces: "k6t-eth0,tap0"}},
	{"tproxy", specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldExcludeInterfaces: "eth9"}},
	{"dns-servers", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldRedirectDNS: "true", redirect.FieldDNSServers: "10.96.0.10,fd00::a", redirect.FieldIPv6: "true"}},
	{"dns-capture-all", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldRedirectDNS: "true", redirect.FieldCaptureAllDNS: "true"}},
	{"owner-groups", specs.Settings{redirect.FieldOutboundCIDRs: "*", redirect.FieldOwnerGroupsInclude: "1001,app"}},
	{"owner-groups-exclude", specs.Settings{redirect.FieldOutboundCIDRs: "*", redirect.FieldOwnerGroupsExclude: "1002"}},
	{"drop-invalid-uids", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldDropInvalid: "true", redirect.FieldProxyUIDs: "1337,1000650000", redirect.FieldProxyGIDs: "1337"}},
	{"ipv6-dual-stack", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldOutboundCIDRsExclude: "10.0.0.1/32,fd00::1/128", redirect.FieldIPv6: "true"}},
}

// TestGoldenRenderings keeps, per case and family, the Istio-style text (what
// `istio-iptables --dry-run` prints and what to diff against Istio) and the restore
// input a fresh namespace receives (our hook-chain layout). -update rewrites them.
func TestGoldenRenderings(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			plan := tc.opts.Plan(t)
			var dry, restore strings.Builder
			for _, fp := range plan.Families {
				dry.WriteString("# " + fp.Family.String() + "\n" + RenderPlanText(&fp))
				l, err := layout(&fp)
				if err != nil {
					t.Fatal(err)
				}
				restore.WriteString("# " + fp.Family.String() + "\n" + restoreText(l, nil))
			}
			checkGolden(t, filepath.Join("testdata", tc.name+".iptables"), dry.String())
			checkGolden(t, filepath.Join("testdata", tc.name+".restore"), restore.String())
		})
	}
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	golden.Check(t, path, []byte(got))
}

// TestLayoutOwnsOneRulePerHook proves the kernel layout touches each built-in chain
// with exactly one rule, a jump to one of our chains, and that hook chains keep the
// plan's rules for that hook in order.
func TestLayoutOwnsOneRulePerHook(t *testing.T) {
	for _, tc := range renderCases {
		spec, _ := tc.opts.Spec()
		plan, err := redirect.Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, fp := range plan.Families {
			ls, err := layout(&fp)
			if err != nil {
				t.Fatal(err)
			}
			for i, tl := range ls {
				final, _ := fp.Tables[i].FinalChains()
				for builtin, want := range map[string][]redirect.Rule{redirect.ChainPrerouting: final[redirect.ChainPrerouting], redirect.ChainOutput: final[redirect.ChainOutput]} {
					hook, ok := tl.Hooks[builtin]
					if len(want) == 0 {
						if ok {
							t.Errorf("%s %s %s: hook rule without plan rules", tc.name, tl.Table, builtin)
						}
						continue
					}
					if !ok || hook.Target.Kind != redirect.TargetJump || !isOurs(hook.Target.Chain) {
						t.Fatalf("%s %s %s: hook %+v is not a jump to our chain", tc.name, tl.Table, builtin, hook)
					}
					got := []redirect.Rule{hook}
					if strings.HasPrefix(hook.Target.Chain, HookChainPrefix) {
						got = tl.Rules[hook.Target.Chain]
					}
					if diff := cmp.Diff(ruleTexts(want), ruleTexts(got)); diff != "" {
						t.Errorf("%s %s %s: hook rules differ from the plan:\n%s", tc.name, tl.Table, builtin, diff)
					}
				}
			}
		}
	}
}

func ruleTexts(rs []redirect.Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, ruleText(r))
	}
	return out
}
