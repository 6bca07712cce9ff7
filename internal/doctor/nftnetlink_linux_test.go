package doctor

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// The agent image has no nft: the netlink check must accept what the plugin's
// nftables backend programs, find a rule deleted by hand (naming it) and a table
// where none belongs, show the live tables as nft would, and see iptables-nft's
// ISTIO chains as stray.
func TestNetlinkCheckWithoutNftFindsDeletedRulesAndStrayTables(t *testing.T) {
	root.Require(t)
	nftCfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":"` + t.TempDir() + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	iptCfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","iptables_mode":"nft","cni_agent_run_dir":"` + t.TempDir() + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	pod := toKubePod(t, injectedPod("web"))
	pp, err := plugin.PlanFor(plugin.ArgsFor(pod), nftCfg, pod, nil, plugin.Sandbox{})
	if err != nil || pp.Plan == nil {
		t.Fatalf("plan for %s: %v (%s)", pod.Key(), err, pp.Decision.Reason)
	}
	plan := pp.Plan
	verify := func(nsPath string, b capture.Backend, plan *redirect.Plan) []string {
		t.Helper()
		d, err := capture.Verify(t.Context(), nsPath, b, plan)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	meshed := newPodSandbox(t, netip.MustParseAddr("10.251.9.1"))
	applyCapture(t, nftCfg, pod, meshed.path)
	if d := verify(meshed.path, netlinkBackend{}, plan); len(d) != 0 {
		t.Errorf("as the plugin programmed it: differences %q", d)
	}
	var shown string
	if err := netns.Do(meshed.path, func() (err error) { shown, _, err = readShapes(); return err }); err != nil {
		t.Fatal(err)
	}
	rendered, err := nftables.Render(plan)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rendered, shapesText(shown)); diff != "" {
		t.Errorf("live tables shown without nft differ from the render (-render +shown):\n%s", diff)
	}
	if d := verify(meshed.path, netlinkBackend{}, &redirect.Plan{}); len(d) == 0 {
		t.Error("tables of ours where none belong: no differences")
	}
	testns.Run(t, meshed.path, exec.Command("nft", "flush", "chain", "ip", "istio-proxy-nat", "ISTIO_REDIRECT"))
	want := []string{`table ip istio-proxy-nat chain ISTIO_REDIRECT: missing rule 1 "meta l4proto tcp redirect to :15001"`}
	if diff := cmp.Diff(want, verify(meshed.path, netlinkBackend{}, plan)); diff != "" {
		t.Errorf("after flushing ISTIO_REDIRECT (-want +got):\n%s", diff)
	}
	if d := verify(meshed.path, iptablesNftChains{}, &redirect.Plan{}); len(d) != 0 {
		t.Errorf("native tables only: stray iptables-nft chains %q", d)
	}

	plain := newPodSandbox(t, netip.MustParseAddr("10.251.9.2"))
	if d := verify(plain.path, netlinkBackend{}, &redirect.Plan{}); len(d) != 0 {
		t.Errorf("clean namespace: differences %q", d)
	}
	applyCapture(t, iptCfg, pod, plain.path)
	d := verify(plain.path, iptablesNftChains{}, &redirect.Plan{})
	if len(d) == 0 || !strings.Contains(strings.Join(d, "\n"), "chain ISTIO_OUTPUT (iptables-nft) is not expected") {
		t.Errorf("iptables-nft capture: stray %q", d)
	}
}
