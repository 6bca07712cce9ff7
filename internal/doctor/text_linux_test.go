package doctor

import (
	"os"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

// TestInspectAndExplainSayTheSameDecision: for pods the plugin redirects, skips
// or refuses, inspect's "Decision:" line is explain's, word for word; a refused
// (ambient) pod is never described as a redirect.
func TestInspectAndExplainSayTheSameDecision(t *testing.T) {
	cfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"istio-cni","type":"istio-cni"}`))
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"sidecar-default.json":   "Decision: traffic is redirected",
		"ambient-pod-label.json": "Decision: REFUSED (rule ambient)",
		"istio-init.json":        "Decision: NOT redirected",
	} {
		data, err := os.ReadFile("../plugin/testdata/pods/" + file)
		if err != nil {
			t.Fatal(err)
		}
		pod, err := kube.DecodePod(data)
		if err != nil {
			t.Fatal(err)
		}
		pp, perr := plugin.PlanFor(plugin.ArgsFor(pod), cfg, pod, nil, plugin.Sandbox{})
		ex := explanation(pod, pp, perr, "iptables")
		in := &Inspection{Pod: pod.Key(), Decision: ex.Decision, Error: ex.Error, Live: map[string]string{}}
		decision := func(text string) string {
			for _, l := range strings.Split(text, "\n") {
				if strings.HasPrefix(l, "Decision:") {
					return l
				}
			}
			return ""
		}
		got, fromExplain := decision(in.Text()), decision(ex.Text())
		if !strings.HasPrefix(got, want) || got != fromExplain {
			t.Errorf("%s: inspect says %q, explain %q; want both to start %q", file, got, fromExplain, want)
		}
	}
}
