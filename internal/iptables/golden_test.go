package iptables

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// renderCases name the specs whose renderings are kept as golden files.
var renderCases = []struct {
	name string
	opts redirect.Options
}{
	{"default-sidecar", redirect.Options{InboundPortsInclude: "*", InboundPortsExclude: "15020,15021,15090", OutboundIPRangesInclude: "*", OutboundPortsExclude: "15020"}},
	{"inbound-ports", redirect.Options{InboundPortsInclude: "80,443", OutboundIPRangesInclude: "10.0.0.0/8,172.16.0.0/12"}},
	{"exclusions", redirect.Options{InboundPortsInclude: "*", InboundPortsExclude: "22", OutboundIPRangesInclude: "*",
		OutboundIPRangesExclude: "169.254.169.254/32,10.1.0.0/16", OutboundPortsExclude: "5432,6379", ExcludeInterfaces: "eth1"}},
	{"virtual-interfaces", redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RerouteVirtualInterfaces: "k6t-eth0,tap0"}},
	{"tproxy", redirect.Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "*", OutboundIPRangesInclude: "*", ExcludeInterfaces: "eth9"}},
	{"dns-servers", redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RedirectDNS: true, DNSServers: []string{"10.96.0.10", "fd00::a"}, EnableIPv6: true}},
	{"dns-capture-all", redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RedirectDNS: true, CaptureAllDNS: true}},
	{"owner-groups", redirect.Options{OutboundIPRangesInclude: "*", OwnerGroupsInclude: "1001,app"}},
	{"owner-groups-exclude", redirect.Options{OutboundIPRangesInclude: "*", OwnerGroupsExclude: "1002"}},
	{"drop-invalid-uids", redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", DropInvalid: true, ProxyUID: "1337,1000650000", ProxyGID: "1337"}},
	{"ipv6-dual-stack", redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", OutboundIPRangesExclude: "10.0.0.1/32,fd00::1/128", EnableIPv6: true}},
}

// TestGoldenRenderings keeps, per case and family, the Istio-style text (what
// `istio-iptables --dry-run` prints and what to diff against Istio) and the restore
// input a fresh namespace receives (our hook-chain layout). -update rewrites them.
func TestGoldenRenderings(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := tc.opts.Spec()
			if err != nil {
				t.Fatal(err)
			}
			plan, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
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
