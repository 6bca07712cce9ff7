package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/silent"
	"github.com/istio-cni/istio-cni/test/harness/testns"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

var backends = []struct {
	name  string
	extra map[string]any
}{
	{"iptables", map[string]any{}},
	{"nftables", map[string]any{"native_nftables": true}},
}

// TestMeshedPodIsRedirectedEndToEnd: the runtime's chain (ptp, then istio-cni) ADDs a
// meshed pod that exists in the API server; real connections in and out land on the
// proxy's capture ports, CHECK passes, a second ADD succeeds, a deleted rule makes
// CHECK fail, and DEL succeeds.
func TestMeshedPodIsRedirectedEndToEnd(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			n := newNode(t, shared)
			list := n.chain(n.istioEntry(b.extra))
			pod := createPod(t, shared, meshedPod("e2e-"+b.name, "web", nil))
			sb, res := n.addPod(t, list, pod)
			if len(res.IPs) == 0 {
				t.Fatalf("ADD returned no IPs: the previous result was not passed through: %+v", res)
			}
			serveTraffic(t, n, sb)
			expectCaptured(t, n, sb)
			if err := n.check(list, sb); err != nil {
				t.Errorf("CHECK after ADD: %v", err)
			}
			// The runtime never repeats a chain's ADD (host-local would refuse the
			// second address), but istio-cni may be run again, for example by the
			// repair path: run it alone with the same previous result.
			if err := n.addIstioAgain(b.extra, sb, res); err != nil {
				t.Errorf("second istio-cni ADD: %v", err)
			}
			if err := n.check(list, sb); err != nil {
				t.Errorf("CHECK after the second ADD: %v", err)
			}
			// Break the capture by hand: CHECK must notice.
			breakCapture(t, sb, b.name)
			err := n.check(list, sb)
			if err == nil || !strings.Contains(err.Error(), "redirection is not as the pod requires") {
				t.Errorf("CHECK after deleting a rule = %v, want a difference report", err)
			}
			if err := n.del(list, sb); err != nil {
				t.Errorf("DEL: %v", err)
			}
			wantNoRules(t, sb, "DEL")
		})
	}
}

func runIn(t *testing.T, ns string, name string, args ...string) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

func breakCapture(t *testing.T, sb *sandboxPod, backend string) {
	t.Helper()
	if backend == "nftables" {
		runIn(t, sb.netns, "nft", "flush", "chain", "ip", "istio-proxy-nat", "ISTIO_REDIRECT")
		return
	}
	runIn(t, sb.netns, "iptables", "-t", "nat", "-D", "ISTIO_REDIRECT", "1")
}

// TestSelection runs each of Istio's selection rules through the real chain: pods
// that must be skipped come up with networking but without capture; a pod that must
// be redirected is captured.
func TestSelection(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	tests := []struct {
		name    string
		pod     *corev1.Pod
		capture bool
	}{
		{"meshed pod", meshedPod("sel", "meshed", nil), true},
		{"excluded namespace", meshedPod("kube-system", "meshed-but-excluded", nil), false},
		{"no istio-proxy container", meshedPod("sel", "plain", nil, func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }), false},
		{"istio-init present", meshedPod("sel", "with-init", nil, func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "istio-init", Image: "proxyv2:1"}}
		}), false},
		{"injection disabled by label", meshedPod("sel", "label-off", nil, func(p *corev1.Pod) {
			p.Labels = map[string]string{"sidecar.istio.io/inject": "false"}
		}), false},
		{"injection disabled by annotation", meshedPod("sel", "annotation-off", map[string]string{"sidecar.istio.io/inject": "false"}), false},
		{"label wins over annotation", meshedPod("sel", "label-on", map[string]string{"sidecar.istio.io/inject": "false"}, func(p *corev1.Pod) {
			p.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
		}), true},
		{"the node agent's own pod", meshedPod("istio-system", "istio-cni-node-x7k2p", nil), false},
		{"no sidecar status", meshedPod("sel", "no-status", nil, func(p *corev1.Pod) {
			delete(p.Annotations, "sidecar.istio.io/status")
		}), false},
		{"envoy disabled", meshedPod("sel", "no-envoy", nil, func(p *corev1.Pod) {
			p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "DISABLE_ENVOY", Value: "true"}}
		}), false},
		{"gateway, not a sidecar", meshedPod("sel", "gateway", nil, func(p *corev1.Pod) {
			p.Spec.Containers[1].Args = []string{"proxy", "router"}
		}), false},
		{"native sidecar in initContainers", meshedPod("sel", "native", nil, func(p *corev1.Pod) {
			always := corev1.ContainerRestartPolicyAlways
			proxy := p.Spec.Containers[1]
			proxy.RestartPolicy = &always
			p.Spec.InitContainers = []corev1.Container{proxy}
			p.Spec.Containers = p.Spec.Containers[:1]
		}), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := createPod(t, shared, tc.pod)
			sb, _ := n.addPod(t, list, pod)
			serveTraffic(t, n, sb)
			if tc.capture {
				expectCaptured(t, n, sb)
			} else {
				expectNotCaptured(t, n, sb)
			}
			if err := n.del(list, sb); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
	}
}

// TestBadAnnotationFailsAddNamingPodAnnotationAndValue: fail closed, with a message a
// person can act on, and nothing left half-applied.
func TestBadAnnotationFailsAddNamingPodAnnotationAndValue(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	pod := createPod(t, shared, meshedPod("bad", "web", map[string]string{"traffic.sidecar.istio.io/includeInboundPorts": "80,70000"}))
	sb := n.newSandbox(pod)
	_, err := n.add(list, sb)
	if err == nil {
		t.Fatal("ADD succeeded for a pod with an invalid annotation")
	}
	wanterr.Mentions(t, err, "bad/web", "traffic.sidecar.istio.io/includeInboundPorts", `"70000"`)
	wantNoRules(t, sb, "a failed ADD")
}

// TestAnnotationsShapeTheCapture: excluded ports and CIDRs are honoured end to end.
func TestAnnotationsShapeTheCapture(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	pod := createPod(t, shared, meshedPod("ann", "web", map[string]string{
		"traffic.sidecar.istio.io/excludeInboundPorts":     "8080",
		"traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8",
	}))
	sb, _ := n.addPod(t, list, pod)
	serveTraffic(t, n, sb)
	in, out := landings(t, n, sb)
	if !strings.HasPrefix(in, "app ") {
		t.Errorf("inbound to excluded port 8080 landed on %q, want the app", in)
	}
	if !strings.HasPrefix(out, "node ") {
		t.Errorf("outbound to excluded range landed on %q, want the node's service", out)
	}
}

// TestLegacyConfigFormat: the seed documents' kubernetes{...} block still works.
func TestLegacyConfigFormat(t *testing.T) {
	n := newNode(t, shared)
	// The legacy format names no run dir: the plugin uses its default on the
	// host, as an Istio install's legacy config would.
	undoDefaultRunDir(t)
	list := n.chain(map[string]any{
		"type":      "istio-cni",
		"log_level": "debug",
		"kubernetes": map[string]any{
			"kubeconfig":         n.runDir + "/istio-cni-kubeconfig",
			"cni_bin_dir":        pluginDir,
			"exclude_namespaces": []string{"istio-system"},
		},
	})
	pod := createPod(t, shared, meshedPod("legacy", "web", nil))
	sb, _ := n.addPod(t, list, pod)
	serveTraffic(t, n, sb)
	expectCaptured(t, n, sb)
}

// TestStandaloneConf: as Multus/CRI-O run it on OpenShift, istio-cni alone (no
// prevResult) in a namespace another network already set up; it returns a valid
// empty result and programs the capture.
func TestStandaloneConf(t *testing.T) {
	n := newNode(t, shared)
	ptpOnly, err := libcni.ConfListFromBytes(mustJSON(t, map[string]any{"cniVersion": "1.0.0", "name": "primary", "plugins": []any{n.ptpEntry()}}))
	if err != nil {
		t.Fatal(err)
	}
	entry := n.istioEntry(nil)
	entry["cniVersion"] = "1.0.0"
	entry["name"] = "istio-cni"
	conf, err := libcni.ConfFromBytes(mustJSON(t, entry))
	if err != nil {
		t.Fatal(err)
	}
	pod := createPod(t, shared, meshedPod("standalone", "web", nil))
	sb := n.newSandbox(pod)
	if _, err := n.add(ptpOnly, sb); err != nil {
		t.Fatalf("primary ADD: %v", err)
	}
	var raw []byte
	err = netns.Do(n.ns, func() error {
		r, err := n.cni.AddNetwork(t.Context(), conf, n.runtimeConf(sb))
		if err == nil {
			raw, err = json.Marshal(r)
		}
		return err
	})
	if err != nil {
		t.Fatalf("standalone ADD: %v", err)
	}
	if !strings.Contains(string(raw), `"cniVersion":"1.0.0"`) {
		t.Errorf("standalone result %s is not a 1.0.0 result", raw)
	}
	serveTraffic(t, n, sb)
	expectCaptured(t, n, sb)
	if err := netns.Do(n.ns, func() error { return n.cni.DelNetwork(t.Context(), conf, n.runtimeConf(sb)) }); err != nil {
		t.Errorf("standalone DEL: %v", err)
	}
}

// TestStandaloneCapturesIPv6FromTheNamespace: in standalone mode (Multus/OpenShift)
// there is no previous result, and during the first ADD the pod's status has no
// addresses yet; the IPv6 capture of a dual-stack or IPv6-only pod must come from the
// addresses its namespace holds, and live IPv6 traffic must reach the proxy.
func TestStandaloneCapturesIPv6FromTheNamespace(t *testing.T) {
	for _, tc := range []struct {
		name string
		ipv4 bool
	}{{"dual-stack", true}, {"IPv6-only", false}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, shared)
			ptp := n.ptpEntry()
			ipam := ptp["ipam"].(map[string]any)
			v6Range := []any{map[string]any{"subnet": fmt.Sprintf("fd00:%x::/64", 0x300+n.subnet)}}
			if tc.ipv4 {
				ipam["ranges"] = append(ipam["ranges"].([]any), v6Range)
				ipam["routes"] = []any{map[string]any{"dst": "0.0.0.0/0"}, map[string]any{"dst": "::/0"}}
			} else {
				ipam["ranges"] = []any{v6Range}
				ipam["routes"] = []any{map[string]any{"dst": "::/0"}}
			}
			primary, err := libcni.ConfListFromBytes(mustJSON(t, map[string]any{"cniVersion": "1.0.0", "name": "primary", "plugins": []any{ptp}}))
			if err != nil {
				t.Fatal(err)
			}
			entry := n.istioEntry(nil)
			entry["cniVersion"], entry["name"] = "1.0.0", "istio-cni"
			conf, err := libcni.ConfFromBytes(mustJSON(t, entry))
			if err != nil {
				t.Fatal(err)
			}
			pod := createPod(t, shared, meshedPod("standalone-"+strings.ToLower(tc.name), "web", nil, func(p *corev1.Pod) {
				p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "ISTIO_DUAL_STACK", Value: "true"}}
			}))
			if len(pod.Status.PodIPs) != 0 {
				t.Fatalf("the pod has status addresses %v; the test needs a pod without (as in its first ADD)", pod.Status.PodIPs)
			}
			sb := n.newSandbox(pod)
			res, err := n.add(primary, sb)
			if err != nil {
				t.Fatalf("primary ADD: %v", err)
			}
			v6 := podIPv6(t, res)
			if err := netns.Do(n.ns, func() error {
				_, err := n.cni.AddNetwork(t.Context(), conf, n.runtimeConf(sb))
				return err
			}); err != nil {
				t.Fatalf("standalone ADD: %v", err)
			}
			expectIPv6Captured(t, n, sb, v6)
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMissingPodFailsAddAfterTheBudget: fail closed, saying the pod does not exist.
func TestMissingPodFailsAddAfterTheBudget(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	pod := meshedPod("missing", "ghost", nil)
	sb := n.newSandbox(pod)
	_, err := n.add(list, sb)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "missing/ghost") {
		t.Fatalf("ADD for a pod the API server does not have = %v, want a lookup failure naming the pod", err)
	}
}

// TestAPIServerDownFailsAddAfterTheBudget: with the API server stopped, ADD retries
// within its budget and then fails saying so; it never reports success.
func TestAPIServerDownFailsAddAfterTheBudget(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	n := newNode(t, cp)
	list := n.chain(n.istioEntry(nil))
	pod := createPod(t, cp, meshedPod("down", "web", nil))
	sb := n.newSandbox(pod)
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err := n.add(list, sb)
	if err == nil {
		t.Fatal("ADD succeeded with the API server down")
	}
	wanterr.Mentions(t, err, "down/web", "lookup failed after 3 tries", "could not be reached", "(bound 5s)")
}

// TestDelAfterNetnsRemovedSucceeds: DEL is idempotent when the namespace is gone.
func TestDelAfterNetnsRemovedSucceeds(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	pod := createPod(t, shared, meshedPod("gone", "web", nil))
	sb, _ := n.addPod(t, list, pod)
	if err := testns.Delete(sb.netns); err != nil {
		t.Fatal(err)
	}
	if err := n.del(list, sb); err != nil {
		t.Errorf("DEL after the namespace vanished: %v", err)
	}
	if err := n.del(list, sb); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// TestFiftyPodsInParallel: 50 ADDs at once all succeed, with no lock errors.
func TestFiftyPodsInParallel(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	var sbs []*sandboxPod
	for i := 0; i < 50; i++ {
		pod := createPod(t, shared, meshedPod("par", fmt.Sprintf("web-%d", i), nil))
		sbs = append(sbs, n.newSandbox(pod))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(sbs))
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.add(list, sb)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD of pod %d: %v", i, err)
		}
	}
	for _, sb := range sbs {
		if out := runIn(t, sb.netns, "iptables-save"); !strings.Contains(out, "ISTIO_REDIRECT") {
			t.Errorf("pod %s has no capture after the parallel ADD", sb.name)
		}
	}
}

// TestStatusReportsAMissingKubeconfig: STATUS says whether the plugin can work,
// with the spec's STATUS error 50 (plugin not available) when it cannot. The
// runtime runs it every few seconds: its log file gets the change of state once,
// not a record per run, and the record of its return. (libcni keeps a failed
// plugin's stderr from the caller: TestStatusLogsAChangeOnceNotEveryCall checks
// stderr.)
func TestStatusReportsAMissingKubeconfig(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	logFile := filepath.Join(n.runDir, plugin.LogFileName)
	count := func(msg string) int {
		data, _ := os.ReadFile(logFile)
		return strings.Count(string(data), `"msg":"`+msg)
	}
	if err := n.cni.GetStatusNetworkList(t.Context(), list); err != nil {
		t.Errorf("STATUS with a kubeconfig: %v", err)
	}
	kubeconfig, err := os.ReadFile(n.runDir + "/istio-cni-kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(n.runDir + "/istio-cni-kubeconfig"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		err := n.cni.GetStatusNetworkList(t.Context(), list)
		var cerr *types.Error
		if !errors.As(err, &cerr) || cerr.Code != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "kubeconfig") {
			t.Errorf("STATUS without a kubeconfig = %v, want error 50 (plugin not available) about it", err)
		}
	}
	if got := count("STATUS: not ready:"); got != 1 {
		t.Errorf("five STATUS runs without a kubeconfig logged %d not-ready records, want 1", got)
	}
	if err := os.WriteFile(n.runDir+"/istio-cni-kubeconfig", kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := n.cni.GetStatusNetworkList(t.Context(), list); err != nil {
			t.Errorf("STATUS with the kubeconfig back: %v", err)
		}
	}
	if got := count("STATUS: ready again"); got != 1 {
		t.Errorf("three STATUS runs with the kubeconfig back logged %d ready-again records, want 1", got)
	}
	if exists(filepath.Join(n.runDir, plugin.NotReadyStateName)) {
		t.Errorf("ready again, the run dir still holds %s", plugin.NotReadyStateName)
	}
}

// TestStatusRemembersTheIptablesNftVersion: STATUS (which the runtime runs every
// few seconds) asks the node's iptables-nft-restore its version and remembers it
// in the run dir, so the first ADDs after an install or a reboot do not each run
// the binary; in nftables mode it asks nothing.
func TestStatusRemembersTheIptablesNftVersion(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			n := newNode(t, shared)
			// nft mode named, not detected: the version is asked only of iptables-nft.
			entry := n.istioEntry(b.extra)
			entry["iptables_mode"] = string(iptables.ModeNFT)
			list := n.chain(entry)
			version := filepath.Join(n.runDir, "xtables", "iptables-nft-version")
			if exists(version) {
				t.Fatalf("%s before STATUS", version)
			}
			if err := n.cni.GetStatusNetworkList(t.Context(), list); err != nil {
				t.Fatalf("STATUS: %v", err)
			}
			data, err := os.ReadFile(version)
			switch {
			case b.name == "nftables" && err == nil:
				t.Errorf("STATUS in nftables mode wrote %s: %q", version, data)
			case b.name == "iptables" && (err != nil || !strings.Contains(string(data), "iptables-nft-restore")):
				t.Errorf("after STATUS in iptables mode, %s: %q, %v; want the binary and its version", version, data, err)
			}
		})
	}
}

// TestStatusNeverCallsTheAPIServer: the runtime turns a failed STATUS into a
// NotReady node, so STATUS must not depend on the API server: with one that
// accepts connections and never answers, STATUS still succeeds, at once.
func TestStatusNeverCallsTheAPIServer(t *testing.T) {
	n := newNode(t, shared)
	apiServer := silent.Listen(t, "tcp", "127.0.0.1:0")
	list := n.chain(n.istioEntry(map[string]any{"kubernetes": map[string]any{"k8s_api_root": "https://" + apiServer.Addr.String()}}))
	began := time.Now()
	if err := n.cni.GetStatusNetworkList(t.Context(), list); err != nil {
		t.Errorf("STATUS with a hanging API server: %v", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("STATUS took %s with a hanging API server", took)
	}
	if apiServer.Accepted() {
		t.Error("STATUS connected to the API server")
	}
}

// TestOlderSpecVersions: runtimes still send 0.3.1 and 0.4.0 conflists; the chain
// works and the result keeps the runtime's version.
func TestOlderSpecVersions(t *testing.T) {
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0"} {
		t.Run(v, func(t *testing.T) {
			n := newNode(t, shared)
			raw := mustJSON(t, map[string]any{"cniVersion": v, "name": "k8s-pod-network", "plugins": []any{n.ptpEntry(), n.istioEntry(nil)}})
			list, err := libcni.ConfListFromBytes(raw)
			if err != nil {
				t.Fatal(err)
			}
			pod := createPod(t, shared, meshedPod("versions", "web-"+strings.ReplaceAll(v, ".", ""), nil))
			sb := n.newSandbox(pod)
			got, err := n.addJSON(list, n.runtimeConf(sb))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if !strings.Contains(string(got), `"cniVersion":"`+v+`"`) {
				t.Errorf("result %s is not a %s result", got, v)
			}
			if out := runIn(t, sb.netns, "iptables-save"); !strings.Contains(out, "ISTIO_REDIRECT") {
				t.Errorf("no capture after a %s ADD", v)
			}
			if err := n.del(list, sb); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
	}
}

// TestVersionAdvertisesExactlyTheTestedSpecVersions: VERSION lists the versions the
// chain is tested with (TestOlderSpecVersions and 1.1.0 everywhere else); a 0.2.0
// config is refused with the CNI's incompatible-version error, before anything is
// touched.
func TestVersionAdvertisesExactlyTheTestedSpecVersions(t *testing.T) {
	n := newNode(t, shared)
	info, err := n.cni.GetVersionInfo(t.Context(), "istio-cni")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}, info.SupportedVersions()); diff != "" {
		t.Errorf("VERSION (-want +got):\n%s", diff)
	}
	raw := mustJSON(t, map[string]any{"cniVersion": "0.2.0", "name": "k8s-pod-network", "plugins": []any{n.istioEntry(nil)}})
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	pod := createPod(t, shared, meshedPod("versions", "web-020", nil))
	sb := n.newSandbox(pod)
	_, err = n.addJSON(list, n.runtimeConf(sb))
	if err == nil || !strings.Contains(err.Error(), "incompatible CNI versions") || !strings.Contains(err.Error(), "0.2.0") {
		t.Errorf("ADD with a 0.2.0 config = %v, want the incompatible-version error naming 0.2.0", err)
	}
	wantNoRules(t, sb, "a refused 0.2.0 ADD")
}

// TestGCRemovesOnlyStaleLockFiles: CNI 1.1's GC runs through the chain and removes
// the per-namespace xtables lock files older than an hour, and nothing else. With
// a config that no longer validates it does the same in the run directory the
// config names and reports the config's error (7) after, as the spec asks of GC
// (go on, remove what it can, report), where it removed nothing.
func TestGCRemovesOnlyStaleLockFiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		extra    map[string]any
		wantCode uint // 0: success
	}{
		{"a valid config", nil, 0},
		{"a config that no longer validates", map[string]any{"plugin_log_level": "loud"}, types.ErrInvalidNetworkConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, shared)
			dir := filepath.Join(n.runDir, "xtables")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			stale, fresh, other := filepath.Join(dir, "xtables-stale.lock"), filepath.Join(dir, "xtables-fresh.lock"), filepath.Join(dir, "keep-me")
			for _, f := range []string{stale, fresh, other} {
				if err := os.WriteFile(f, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			old := time.Now().Add(-2 * time.Hour)
			for _, f := range []string{stale, other} {
				if err := os.Chtimes(f, old, old); err != nil {
					t.Fatal(err)
				}
			}
			list := n.chain(n.istioEntry(tc.extra))
			err := netns.Do(n.ns, func() error { return n.cni.GCNetworkList(t.Context(), list, &libcni.GCArgs{}) })
			var cerr *types.Error
			switch {
			case tc.wantCode == 0 && err != nil:
				t.Fatalf("GC: %v", err)
			case tc.wantCode != 0 && (!errors.As(err, &cerr) || cerr.Code != tc.wantCode):
				t.Fatalf("GC: %v, want the plugin's error %d", err, tc.wantCode)
			}
			if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("GC left the stale lock file %s (stat: %v)", stale, err)
			}
			for _, f := range []string{fresh, other} {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("GC removed %s, which it must keep: %v", f, err)
				}
			}
		})
	}
}

// TestExtraBypassUIDs: the admin's node-wide extra_bypass_uids let an init container
// running as a fixed uid reach the network directly (seed 004's OpenShift problem),
// while the app's other traffic is still captured.
func TestExtraBypassUIDs(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(map[string]any{"extra_bypass_uids": []int{1000}}))
	pod := createPod(t, shared, meshedPod("bypass", "web", nil))
	sb, _ := n.addPod(t, list, pod)
	serveTraffic(t, n, sb)
	in, out := landings(t, n, sb) // landings probes as uid 1000
	if want := fmt.Sprintf("inbound %s:8080", sb.ip); in != want {
		t.Errorf("inbound landed on %q, want %q", in, want)
	}
	if !strings.HasPrefix(out, "node ") {
		t.Errorf("uid 1000's outbound landed on %q, want the node's service (bypassed)", out)
	}
	other, err := sandbox.ProbeAs(sb.netns, selfExe, 2000, "tcp", netip.AddrPortFrom(sb.gw, uint16(n.svcPort)), "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(other, "outbound ") {
		t.Errorf("uid 2000's outbound landed on %q, want the proxy", other)
	}
}

// TestDualStackPodIsCapturedOnBothFamilies: with ISTIO_DUAL_STACK the IPv6 rules are
// programmed too and IPv6 inbound traffic reaches the proxy.
func TestDualStackPodIsCapturedOnBothFamilies(t *testing.T) {
	n := newNode(t, shared)
	ptp := n.ptpEntry()
	ipam := ptp["ipam"].(map[string]any)
	ipam["ranges"] = append(ipam["ranges"].([]any), []any{map[string]any{"subnet": fmt.Sprintf("fd00:%x::/64", 0x200+n.subnet)}})
	ipam["routes"] = []any{map[string]any{"dst": "0.0.0.0/0"}, map[string]any{"dst": "::/0"}}
	list, err := libcni.ConfListFromBytes(mustJSON(t, map[string]any{"cniVersion": "1.1.0", "name": "k8s-pod-network", "plugins": []any{ptp, n.istioEntry(nil)}}))
	if err != nil {
		t.Fatal(err)
	}
	pod := createPod(t, shared, meshedPod("dual", "web", nil, func(p *corev1.Pod) {
		p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "ISTIO_DUAL_STACK", Value: "true"}}
	}))
	sb, res := n.addPod(t, list, pod)
	expectIPv6Captured(t, n, sb, podIPv6(t, res))
}

// TestNoKubernetesArgsPassesThrough: without K8S_POD_NAME/NAMESPACE (not a Kubernetes
// pod) the plugin passes the previous result through and touches nothing.
func TestNoKubernetesArgsPassesThrough(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	sb := n.newSandbox(meshedPod("none", "none", nil))
	rt := n.runtimeConf(sb)
	rt.Args = nil
	res, err := n.addJSON(list, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if !strings.Contains(string(res), `"ips"`) {
		t.Errorf("result %s lost the previous plugin's IPs", res)
	}
	wantNoRules(t, sb, "an ADD without Kubernetes arguments")
}

// TestTProxyAnnotation: sidecar.istio.io/interceptionMode: TPROXY programs the mangle
// table capture and its policy routing in the pod.
func TestTProxyAnnotation(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	pod := createPod(t, shared, meshedPod("tproxy", "web", map[string]string{"sidecar.istio.io/interceptionMode": "TPROXY"}))
	sb, _ := n.addPod(t, list, pod)
	if out := runIn(t, sb.netns, "iptables-save", "-t", "mangle"); !strings.Contains(out, "-j TPROXY") {
		t.Errorf("no TPROXY rule:\n%s", out)
	}
	if out := runIn(t, sb.netns, "ip", "rule"); !strings.Contains(out, "fwmark 0x539 lookup 133") {
		t.Errorf("no policy routing rule:\n%s", out)
	}
	c, err := sandbox.Serve(sb.netns, 0, "tproxy", "tcp4", "0.0.0.0:15006", true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, want := sandbox.ProbeFrom(n.ns, "tcp", netip.AddrPortFrom(sb.ip, 8080)), fmt.Sprintf("tproxy %s:8080", sb.ip); got != want {
		t.Errorf("TPROXY inbound landed on %q, want %q", got, want)
	}
}

// startPodCache runs the agent's pod cache for node-1 in the node's run dir.
func startPodCache(t testing.TB, n *node) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv := podcache.New(n.cp.AdminClient(), "node-1", nil)
	errc := make(chan error, 1)
	sock := filepath.Join(n.runDir, podcache.SocketName)
	go func() { errc <- srv.Run(ctx, sock) }()
	deadline := time.Now().Add(10 * time.Second)
	for !srv.Synced() || !srv.NamespacesSynced() || !exists(sock) {
		select {
		case err := <-errc:
			// Run's own error, at once (a socket path over the kernel's 108
			// bytes under a long TMPDIR was a bare timeout before).
			cancel()
			t.Fatalf("pod cache did not start: %v (socket %s)", err, sock)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("pod cache did not start within 10s (socket %s)", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("pod cache: %v", err)
		}
	})
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// TestLookupUsesTheAgentsPodCache: with the agent's pod cache running, ADD reads the
// pod from the agent's file of it, or from its socket when there is no file; a pod
// the cache does not hold (scheduled to another node in its view) is still read
// from the API server, so the cache never decides alone.
func TestLookupUsesTheAgentsPodCache(t *testing.T) {
	n := newNode(t, shared)
	startPodCache(t, n)
	list := n.chain(n.istioEntry(nil))
	for _, tc := range []struct {
		name, node, wantLog string
		removeFile          bool
	}{
		{"on-this-node", "node-1", "pod found in the agent's files", false},
		{"no-file", "node-1", "pod found in the agent's cache", true},
		{"cache-miss", "node-2", "asking the API server", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := createPod(t, shared, meshedPod("cache", tc.name, nil, func(p *corev1.Pod) { p.Spec.NodeName = tc.node }))
			sb := n.newSandbox(pod)
			if tc.node == "node-1" {
				// The watch may lag the create by a few milliseconds.
				time.Sleep(200 * time.Millisecond)
			}
			if tc.removeFile {
				path, _ := kube.AgentPodFile(filepath.Join(n.runDir, kube.AgentPodFilesDir), pod.Namespace, pod.Name)
				if err := os.Remove(path); err != nil {
					t.Fatalf("the agent's file of the pod: %v", err)
				}
			}
			if _, err := n.add(list, sb); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if !strings.Contains(n.stderr.String(), tc.wantLog) {
				t.Errorf("plugin log lacks %q", tc.wantLog)
			}
			if out := runIn(t, sb.netns, "iptables-save"); !strings.Contains(out, "ISTIO_REDIRECT") {
				t.Errorf("no capture")
			}
		})
	}
}

// TestTheNextADDResumesTheTLSSessionToTheAPIServer: an ADD that asks the real
// API server keeps its TLS session in the run directory (0600), and the next
// ADD's process resumes it (logged as podAPITLSResumed) and captures its pod.
// The full handshake's key exchange is Go's default, post-quantum one; the
// resumed ones offer X25519 alone (kube.resumeCurves).
func TestTheNextADDResumesTheTLSSessionToTheAPIServer(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	session := filepath.Join(n.runDir, plugin.TLSSessionName)
	for i, want := range []string{
		"podAPITLSResumed=false podAPITLSKeyExchange=X25519MLKEM768",
		"podAPITLSResumed=true podAPITLSKeyExchange=X25519 ",
		"podAPITLSResumed=true podAPITLSKeyExchange=X25519 ",
	} {
		pod := createPod(t, shared, meshedPod("tls-session", fmt.Sprintf("web-%d", i), nil))
		before := len(n.stderr.String())
		sb, _ := n.addPod(t, list, pod)
		if log := n.stderr.String()[before:]; !strings.Contains(log, want) {
			t.Errorf("ADD %d: the plugin's log lacks %q:\n%s", i+1, want, log)
		}
		if out := runIn(t, sb.netns, "iptables-save"); !strings.Contains(out, "ISTIO_REDIRECT") {
			t.Errorf("ADD %d: no capture", i+1)
		}
		fi, err := os.Stat(session)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("ADD %d: the session file: %v (mode %v); want it, 0600", i+1, err, fi.Mode())
		}
	}
}

// TestThePodIsReadInProtobufAsInJSON: kube.Client asks the real API server for a
// pod in protobuf (kube.ProtobufContentType) and gets it so; what it reads is
// what the same pod's JSON from the same API server decodes to (kube.DecodePod),
// for a pod that sets every field the plugin reads, one being deleted (held by a
// finalizer) and, from the watch cache too, with its status set; a pod that does
// not exist is ErrNotFound with the API server's message, which came in protobuf
// as well. The plugin's ADD logs the encoding it read (podAPIEncoding).
func TestThePodIsReadInProtobufAsInJSON(t *testing.T) {
	ctx := t.Context()
	n := newNode(t, shared)
	kc, err := kube.LoadKubeconfig(filepath.Join(n.runDir, "istio-cni-kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := kube.NewClient(kc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rich := createPod(t, shared, meshedPod("proto", "rich", map[string]string{"traffic.sidecar.istio.io/excludeOutboundPorts": "15020"}, func(p *corev1.Pod) {
		p.Labels = map[string]string{"app": "rich", "empty": ""}
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](0)}
		p.Spec.InitContainers = []corev1.Container{{
			Name: "istio-proxy-native", Image: "proxyv2:1", Args: []string{"proxy", ""},
			RestartPolicy:   ptr.To(corev1.ContainerRestartPolicyAlways),
			Env:             []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "EMPTY"}},
			Ports:           []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolUDP}},
			SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1337), RunAsGroup: ptr.To[int64](1337)},
		}}
		p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{}
	}))
	rich.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.9.0.7", PodIPs: []corev1.PodIP{{IP: "10.9.0.7"}, {IP: "fd00:9::7"}}}
	if _, err := shared.AdminClient().CoreV1().Pods("proto").UpdateStatus(ctx, rich, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleting := createPod(t, shared, meshedPod("proto", "deleting", nil, func(p *corev1.Pod) { p.Finalizers = []string{"example.com/hold"} }))
	t.Cleanup(func() {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		shared.AdminClient().CoreV1().Pods("proto").Patch(context.Background(), deleting.Name, "application/merge-patch+json", patch, metav1.PatchOptions{})
	})
	if err := shared.AdminClient().CoreV1().Pods("proto").Delete(ctx, deleting.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{rich.Name, deleting.Name} {
		for _, fromCache := range []bool{false, true} {
			path := kube.PodPath("proto", name)
			if fromCache {
				path = kube.FromCache(path)
			}
			var got kube.Pod
			// The watch cache may be a moment behind the status and the deletion.
			var want *kube.Pod
			deadline := time.Now().Add(10 * time.Second)
			for {
				req := shared.AdminClient().CoreV1().RESTClient().Get().AbsPath(kube.PodPath("proto", name)).SetHeader("Accept", "application/json")
				if fromCache {
					req = req.Param("resourceVersion", "0")
				}
				js, err := req.DoRaw(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if want, err = kube.DecodePod(js); err != nil {
					t.Fatal(err)
				}
				got = kube.Pod{}
				if err := client.Get(ctx, path, &got); err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				if cmp.Equal(*want, got) || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if client.Encoding() != kube.EncodingProtobuf {
				t.Errorf("GET %s: answered in %q; want %s", path, client.Encoding(), kube.EncodingProtobuf)
			}
			if diff := cmp.Diff(*want, got); diff != "" {
				t.Errorf("GET %s: protobuf gives otherwise than JSON (-JSON +protobuf):\n%s", path, diff)
			}
			if name == deleting.Name && got.Metadata.DeletionTimestamp == nil {
				t.Errorf("GET %s: no deletionTimestamp", path)
			}
			if name == rich.Name && (len(got.Status.PodIPs) != 2 || len(got.Spec.InitContainers) != 1) {
				t.Errorf("GET %s: status or init containers missing: %+v", path, got)
			}
		}
	}
	var missing kube.Pod
	err = client.Get(ctx, kube.PodPath("proto", "missing"), &missing)
	var serr *kube.StatusError
	if !errors.Is(err, kube.ErrNotFound) || !errors.As(err, &serr) || serr.Reason != "NotFound" || !strings.Contains(serr.Message, `pods "missing" not found`) {
		t.Errorf("GET of a missing pod: %v; want ErrNotFound, reason NotFound and the API server's message", err)
	}
	// That Status came in protobuf: the API server answers an error in the
	// encoding the request asks for.
	status, _ := shared.AdminClient().CoreV1().RESTClient().Get().AbsPath(kube.PodPath("proto", "missing")).
		SetHeader("Accept", kube.ProtobufContentType+", application/json").Do(ctx).Raw()
	if !bytes.HasPrefix(status, kube.ProtobufMagic) {
		t.Errorf("a missing pod's Status asked for in protobuf came as %q", status)
	}
	// The ADD: a pod the plugin captures (rich's proxy would run as the pod's
	// user 1000, which the plugin refuses).
	list := n.chain(n.istioEntry(nil))
	before := len(n.stderr.String())
	sb, _ := n.addPod(t, list, createPod(t, shared, meshedPod("proto", "captured", nil)))
	if log := n.stderr.String()[before:]; !strings.Contains(log, "podAPIEncoding=protobuf") {
		t.Errorf("the ADD's log lacks podAPIEncoding=protobuf:\n%s", log)
	}
	if out := runIn(t, sb.netns, "iptables-save"); !strings.Contains(out, "ISTIO_REDIRECT") {
		t.Errorf("no capture")
	}
}

// TestTheADDsOutcomeLineSaysWhatItsProcessTook: a captured pod's ADD line and an
// excluded pod's carry the plugin process's own CPU time (a positive duration,
// at most the process's life) and its voluntary and involuntary context
// switches, which tell an ADD that waited for a CPU from one that worked.
func TestTheADDsOutcomeLineSaysWhatItsProcessTook(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	usage := regexp.MustCompile(`process\.cpu=(\S+) process\.voluntarySwitches=(\d+) process\.involuntarySwitches=(\d+)`)
	took := regexp.MustCompile(` took=(\S+)`)
	for _, tc := range []struct{ namespace, line string }{
		{"usage", "ADD: traffic redirected to the sidecar"},
		{"kube-system", "ADD: pod passed through"},
	} {
		pod := createPod(t, shared, meshedPod(tc.namespace, "usage-web", nil))
		before := len(n.stderr.String())
		start := time.Now()
		n.addPod(t, list, pod)
		chain := time.Since(start)
		var line string
		for _, l := range strings.Split(n.stderr.String()[before:], "\n") {
			if strings.Contains(l, tc.line) {
				line = l
			}
		}
		m := usage.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("%s: no process usage on the line %q", tc.namespace, line)
			continue
		}
		cpu, err := time.ParseDuration(m[1])
		if err != nil || cpu <= 0 || cpu > chain {
			t.Errorf("%s: process.cpu=%s (%v); want a positive duration under the chain's %v", tc.namespace, m[1], err, chain)
		}
		if tm := took.FindStringSubmatch(line); tm == nil {
			t.Errorf("%s: no took on the line %q", tc.namespace, line)
		}
	}
}

// TestAmbientPodIsRefusedNotStartedUncaptured: a pod that asks for Istio's ambient
// mode (which this plugin does not have) fails its ADD with a message that says so,
// and its namespace holds none of our rules; a sidecar pod with the same label is
// captured as a sidecar pod.
func TestAmbientPodIsRefusedNotStartedUncaptured(t *testing.T) {
	n := newNode(t, shared)
	list := n.chain(n.istioEntry(nil))
	ambient := func(p *corev1.Pod) { p.Labels = map[string]string{"istio.io/dataplane-mode": "ambient"} }
	pod := createPod(t, shared, meshedPod("ambient", "web", nil, ambient, func(p *corev1.Pod) {
		p.Annotations, p.Spec.Containers = nil, p.Spec.Containers[:1]
	}))
	sb := n.newSandbox(pod)
	_, err := n.add(list, sb)
	if err == nil || !strings.Contains(err.Error(), "no ambient mode") || !strings.Contains(err.Error(), "ambient/web") {
		t.Fatalf("ADD of an ambient pod = %v, want a refusal naming the pod and ambient mode", err)
	}
	if out := runIn(t, sb.netns, "iptables-save"); strings.Contains(out, "ISTIO_") {
		t.Errorf("a refused ADD left rules:\n%s", out)
	}
	sidecar := createPod(t, shared, meshedPod("ambient", "sidecar", nil, ambient))
	sb2 := n.newSandbox(sidecar)
	if _, err := n.add(list, sb2); err != nil {
		t.Fatalf("ADD of a sidecar pod labelled ambient: %v", err)
	}
	serveTraffic(t, n, sb2)
	expectCaptured(t, n, sb2)
}

// TestAmbientNamespaceRefusesPodsWithoutASidecar: in a namespace labelled
// istio.io/dataplane-mode=ambient (Istio's ambient mode, which this plugin does not
// have), a pod without a sidecar fails its ADD with a message that names the pod,
// the namespace and its label, and its network namespace holds none of our rules; a
// pod there labelled istio.io/dataplane-mode=none is left alone, and a sidecar pod is
// captured as a sidecar pod. The namespace's labels come from the API server, or
// from the agent's cache when it runs: then the plugin's identity may not even get
// namespaces, so every answer about one came from the cache. Without the cache, an
// identity that may not get namespaces fails the ADD closed, saying so.
func TestAmbientNamespaceRefusesPodsWithoutASidecar(t *testing.T) {
	noSidecar := func(p *corev1.Pod) { p.Annotations, p.Spec.Containers = nil, p.Spec.Containers[:1] }
	for _, tc := range []struct {
		name, ns string
		cache    bool
	}{
		{"namespace from the API server", "ambient-ns-api", false},
		{"namespace from the agent's cache, no API request", "ambient-ns-cache", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labelNamespace(t, tc.ns, map[string]string{"istio.io/dataplane-mode": "ambient"})
			plainNS := tc.ns + "-plain"
			labelNamespace(t, plainNS, nil)
			n := newNode(t, shared)
			if tc.cache {
				startPodCache(t, n)
				usePodsOnlyIdentity(t, n)
			}
			list := n.chain(n.istioEntry(nil))

			pod := createPod(t, shared, meshedPod(tc.ns, "web", nil, noSidecar))
			sb := n.newSandbox(pod)
			_, err := n.add(list, sb)
			wanterr.Mentions(t, err, "pod "+tc.ns+"/web", "namespace "+tc.ns, "istio.io/dataplane-mode=ambient", "no ambient mode",
				"label the pod istio.io/dataplane-mode=none")
			wantNoRules(t, sb, "a refused ADD")

			optedOut := createPod(t, shared, meshedPod(tc.ns, "opted-out", nil, noSidecar, func(p *corev1.Pod) {
				p.Labels = map[string]string{"istio.io/dataplane-mode": "none"}
			}))
			sb2 := n.newSandbox(optedOut)
			if _, err := n.add(list, sb2); err != nil {
				t.Fatalf("ADD of a pod labelled dataplane-mode=none in an ambient namespace: %v", err)
			}
			wantNoRules(t, sb2, "the ADD of a pod labelled none")
			serveTraffic(t, n, sb2)
			expectNotCaptured(t, n, sb2)

			sidecar := createPod(t, shared, meshedPod(tc.ns, "sidecar", nil))
			sb3 := n.newSandbox(sidecar)
			if _, err := n.add(list, sb3); err != nil {
				t.Fatalf("ADD of a sidecar pod in an ambient namespace: %v", err)
			}
			serveTraffic(t, n, sb3)
			expectCaptured(t, n, sb3)

			// The common case: a pod without a sidecar in a namespace without the label.
			plain := createPod(t, shared, meshedPod(plainNS, "plain", nil, noSidecar))
			sb4 := n.newSandbox(plain)
			if _, err := n.add(list, sb4); err != nil {
				t.Fatalf("ADD of a sidecar-less pod in a namespace without the label: %v", err)
			}
			wantNoRules(t, sb4, "the ADD of a pod in a plain namespace")
			if tc.cache && !strings.Contains(n.stderr.String(), "namespace found in the agent's cache") {
				t.Errorf("the plugin did not read the namespace from the agent's cache")
			}
		})
	}
	t.Run("a plugin that may not get namespaces fails closed", func(t *testing.T) {
		const ns = "ambient-ns-rbac"
		labelNamespace(t, ns, nil)
		n := newNode(t, shared)
		usePodsOnlyIdentity(t, n)
		list := n.chain(n.istioEntry(map[string]any{"pod_lookup": map[string]any{"retries": 2, "interval": "100ms"}}))
		sb := n.newSandbox(createPod(t, shared, meshedPod(ns, "web", nil, noSidecar)))
		_, err := n.add(list, sb)
		wanterr.Mentions(t, err, "pod "+ns+"/web: namespace "+ns+": lookup failed after 2 tries", "the API server refused with HTTP 403")
		wantNoRules(t, sb, "a failed ADD")
	})
}

// usePodsOnlyIdentity gives the node's plugin a kubeconfig of a ServiceAccount that
// may get pods and nothing else (no namespaces), as an older chart granted.
func usePodsOnlyIdentity(t *testing.T, n *node) {
	t.Helper()
	kc, err := shared.ServiceAccountKubeconfig(t.Context(), "istio-system", "istio-cni-pods-only",
		[]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.runDir, "istio-cni-kubeconfig"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// labelNamespace creates the namespace (with its default ServiceAccount) and sets its
// labels.
func labelNamespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	if err := shared.EnsureNamespace(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	namespaces := shared.AdminClient().CoreV1().Namespaces()
	ns, err := namespaces.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	maps.Copy(ns.Labels, labels)
	if _, err := namespaces.Update(t.Context(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestOversizedAnnotationsAreRefusedWithinTheirLimits: an annotation past its limit
// (a list of 300 ports; a 200 KiB value, about what the API server's 256 KiB bound on
// a pod's annotations lets through) fails the ADD naming the annotation, the
// count or size and the limit, quotes no more than the start of the value, and
// leaves no rules behind.
func TestOversizedAnnotationsAreRefusedWithinTheirLimits(t *testing.T) {
	ports := make([]string, 300)
	for i := range ports {
		ports[i] = strconv.Itoa(20000 + i)
	}
	const excludeOutbound, includeOutbound, includeInbound, excludeInterfaces = "traffic.sidecar.istio.io/excludeOutboundPorts",
		"traffic.sidecar.istio.io/includeOutboundPorts", "traffic.sidecar.istio.io/includeInboundPorts", "traffic.sidecar.istio.io/excludeInterfaces"
	list256 := func(item func(i int) string) string {
		items := make([]string, 256)
		for i := range items {
			items[i] = item(i)
		}
		return strings.Join(items, ",")
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        []string
	}{
		{"too many ports", map[string]string{excludeOutbound: strings.Join(ports, ",")}, []string{"excludeOutboundPorts", "300 items given, at most 256"}},
		{"a 200 KiB value", map[string]string{excludeOutbound: strings.Repeat("1,", 100<<10)}, []string{"excludeOutboundPorts", "204800 bytes, longer than the limit of 16384"}},
		// Each list within its own limit, all of them over the pod's: the
		// refusal names each annotation that gave items, and how many.
		{"too many items in all", map[string]string{
			excludeOutbound:   list256(func(i int) string { return strconv.Itoa(20000 + i) }),
			includeOutbound:   list256(func(i int) string { return strconv.Itoa(30000 + i) }),
			includeInbound:    list256(func(i int) string { return strconv.Itoa(40000 + i) }),
			excludeInterfaces: list256(func(i int) string { return "eth" + strconv.Itoa(i) }),
		}, []string{includeInbound + " (256 items)", includeOutbound + " (256)", excludeOutbound + " (256)", excludeInterfaces + " (256)",
			"1029 items in all, more than the limit of 1024"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, shared)
			list := n.chain(n.istioEntry(nil))
			pod := createPod(t, shared, meshedPod("limits", strings.ToLower(strings.ReplaceAll(tc.name, " ", "-")), tc.annotations))
			sb := n.newSandbox(pod)
			_, err := n.add(list, sb)
			wanterr.Mentions(t, err, tc.want...)
			if len(err.Error()) > 2048 {
				t.Errorf("the error is %d bytes: the value was echoed", len(err.Error()))
			}
			if out := runIn(t, sb.netns, "iptables-save"); strings.Contains(out, "ISTIO_") {
				t.Errorf("a refused ADD left rules:\n%s", out)
			}
		})
	}
}

// undoDefaultRunDir removes, when the test ends, what the plugin wrote under its
// default run dir (plugin.DefaultAgentRunDir, on the host) in a test whose config
// names no run dir: the directory itself if it was not there before, else what
// appeared in it. The plugin writes there at least the node's iptables-nft
// version (iptables.Config.NativeStateDir); a fresh machine has no such
// directory, and make test's host check fails a run that leaves one.
func undoDefaultRunDir(t *testing.T) {
	t.Helper()
	dir := plugin.DefaultAgentRunDir
	before := map[string]bool{}
	_, err := os.Lstat(dir)
	existed := err == nil
	if existed {
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				before[p] = true
			}
			return nil
		})
	}
	t.Cleanup(func() {
		if !existed {
			if err := os.RemoveAll(dir); err != nil {
				t.Errorf("removing the plugin's default run dir: %v", err)
			}
			return
		}
		var added []string
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err == nil && !before[p] {
				added = append(added, p)
			}
			return nil
		})
		for i := len(added) - 1; i >= 0; i-- { // deepest first
			if err := os.RemoveAll(added[i]); err != nil {
				t.Errorf("removing what the test left in the plugin's default run dir: %v", err)
			}
		}
	})
}

// TestAProxyUIDFromThePodThatAnotherContainerSharesFailsAddClosed: istio-proxy
// sets no runAsUser or runAsGroup and the pod's securityContext sets both, which
// the app inherits: exempting the pod's ids as the proxy's would let the app's
// traffic bypass the proxy, so the ADD fails, naming the pod, each id, the pod's
// securityContext, the app and the fix, and the pod's namespace holds none of our
// rules (both backends). With the app setting its own ids, the pod's are the
// proxy's alone and are exempted: the pod's uid reaches the network directly, the
// app's is captured.
func TestAProxyUIDFromThePodThatAnotherContainerSharesFailsAddClosed(t *testing.T) {
	podIDs := func(p *corev1.Pod) {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2000), RunAsGroup: ptr.To[int64](3000)}
	}
	ownApp := func(p *corev1.Pod) {
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000)}
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			n := newNode(t, shared)
			list := n.chain(n.istioEntry(b.extra))
			pod := createPod(t, shared, meshedPod("podids-"+b.name, "web", nil, podIDs))
			sb := n.newSandbox(pod)
			_, err := n.add(list, sb)
			if err == nil {
				t.Fatal("ADD succeeded for a pod whose app shares the proxy's uid and gid from the pod's securityContext")
			}
			wanterr.Mentions(t, err, "podids-"+b.name+"/web",
				"the pod's securityContext.runAsUser, 2000", "the container app runs as uid 2000 too",
				"the pod's securityContext.runAsGroup, 3000", "the container app runs as gid 3000 too",
				"set istio-proxy's securityContext.runAsUser", "set istio-proxy's securityContext.runAsGroup")
			wantNoRules(t, sb, "a refused ADD")

			own := createPod(t, shared, meshedPod("podids-"+b.name, "own", nil, podIDs, ownApp))
			sb2, _ := n.addPod(t, list, own)
			serveTraffic(t, n, sb2)
			if _, out := landings(t, n, sb2); !strings.HasPrefix(out, "outbound ") { // as uid 1000, the app's
				t.Errorf("the app's outbound landed on %q, want the proxy", out)
			}
			proxy, err := sandbox.ProbeAs(sb2.netns, selfExe, 2000, "tcp", netip.AddrPortFrom(sb2.gw, uint16(n.svcPort)), "-test.run=^$")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(proxy, "node ") {
				t.Errorf("uid 2000's outbound (the proxy's) landed on %q, want the node's service (exempt)", proxy)
			}
		})
	}
}
