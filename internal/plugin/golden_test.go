package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// goldenRules pins the rule each testdata pod must reach, so that -update cannot
// quietly bless a changed verdict.
var goldenRules = map[string]Rule{
	"sidecar-default":              RuleSidecar,
	"sidecar-env-not-boolean":      RuleSidecar,
	"native-sidecar-dns-dualstack": RuleSidecar,
	"ipv6-only":                    RuleSidecar,
	"openshift-namespace-uid":      RuleSidecar,
	"pod-level-run-as-user":        RuleSidecar,
	"bad-pod-level-run-as-user":    RuleSidecar,
	"proxy-uid-shared":             RuleSidecar,
	"traffic-annotations":          RuleSidecar,
	"kubevirt-interfaces":          RuleSidecar,
	"bad-annotation":               RuleSidecar,
	"gateway-router":               RuleNotSidecar,
	"istio-init":                   RuleIstioInit,
	"no-sidecar":                   RuleNoIstioProxy,
	"inject-disabled-label":        RuleInjectDisabled,
	"not-injected-no-status":       RuleNoSidecarStatus,
	"disable-envoy":                RuleEnvoyDisabled,
	"excluded-namespace":           RuleNamespaceExcluded,
	"node-agent":                   RuleNodeAgent,
	"ambient-pod-label":            RuleAmbient,
	"ambient-namespace":            RuleAmbient,
	"ambient-namespace-opt-out":    RuleNoIstioProxy,
	"ambient-namespace-sidecar":    RuleSidecar,
	"namespace-not-looked-up":      RuleNeedNamespace,
}

// goldenSpec shows the interception mode by name.
type goldenSpec struct {
	Mode string `json:"Mode"`
	redirect.Spec
}

type goldenDecision struct {
	Pod      string      `json:"pod"`
	Decision Decision    `json:"decision"`
	Spec     *goldenSpec `json:"spec,omitempty"`
	// EnvNotBool: what the ADD warns of.
	EnvNotBool []EnvNotBool `json:"envNotBool,omitempty"`
	// SharedProxyID: what the ADD warns of.
	SharedProxyID []SharedProxyID `json:"sharedProxyID,omitempty"`
	Error         string          `json:"error,omitempty"`
}

// TestGoldenDecisions runs each API-server-shaped pod in testdata/pods, with its
// namespace from testdata/namespaces (none there: not looked up), through the
// selection and, when selected, the spec builder, with testdata/config.json, and
// compares with testdata/decisions/<pod>.json.
func TestGoldenDecisions(t *testing.T) {
	raw, err := os.ReadFile("testdata/config.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/pods/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata pods: %v", err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			pod, err := kube.DecodePod(data)
			if err != nil {
				t.Fatal(err)
			}
			ns := goldenNamespace(t, pod.Metadata.Namespace)
			pp, err := PlanFor(ArgsFor(pod), cfg, pod, ns, Sandbox{})
			got := goldenDecision{Pod: pod.Key(), Decision: pp.Decision}
			if want, ok := goldenRules[name]; !ok {
				t.Errorf("pod %s has no expected rule in goldenRules", name)
			} else if got.Decision.Rule != want {
				t.Errorf("rule = %s, want %s (%s)", got.Decision.Rule, want, got.Decision.Reason)
			}
			if err != nil {
				got.Error = err.Error()
			} else if pp.Spec != nil {
				got.Spec = &goldenSpec{Mode: pp.Spec.Mode.String(), Spec: *pp.Spec}
				got.EnvNotBool, got.SharedProxyID = pp.EnvNotBool, pp.SharedProxyID
			}
			out, err := json.MarshalIndent(got, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, '\n')
			golden.Check(t, filepath.Join("testdata", "decisions", name+".json"), out)
		})
	}
	for name := range goldenRules {
		if !seen[name] {
			t.Errorf("goldenRules lists %s but testdata/pods/%s.json is missing", name, name)
		}
	}
}

// goldenNamespace is testdata/namespaces/<name>.json as the API server serves it,
// nil when there is none (the caller has not looked the namespace up).
func goldenNamespace(t *testing.T, name string) *kube.Namespace {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "namespaces", name+".json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var ns kube.Namespace
	if err := json.Unmarshal(data, &ns); err != nil || ns.Metadata.Name != name {
		t.Fatalf("testdata namespace %s: %v (name %q)", name, err, ns.Metadata.Name)
	}
	return &ns
}
