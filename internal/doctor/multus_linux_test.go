package doctor

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
)

// The chart's openshift profile: a standalone istio-cni.conf in Multus' directory.
const standaloneConf = `{"cniVersion": "1.0.0", "name": "istio-cni", "type": "istio-cni",
  "cni_agent_run_dir": "RUNDIR", "iptables_mode": "nft", "exclude_namespaces": ["openshift-operators"]}`

const nadCRD = `{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
  "spec": {
    "group": "k8s.cni.cncf.io", "scope": "Namespaced",
    "names": {"plural": "network-attachment-definitions", "singular": "network-attachment-definition", "kind": "NetworkAttachmentDefinition", "shortNames": ["net-attach-def"]},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"config": {"type": "string"}}}}}}}]
  }
}`

func postRaw(t *testing.T, cp *controlplane.ControlPlane, path, body string) {
	t.Helper()
	err := cp.AdminClient().Discovery().RESTClient().Post().AbsPath(path).
		SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(t.Context()).Error()
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
}

// TestInspectChecksTheOpenShiftMultusLayout runs inspect with the openshift
// profile's directories: the config is the standalone istio-cni.conf in Multus'
// directory, the plugin binary must be in CRI-O's bin directory, and each pod
// must request the network whose NetworkAttachmentDefinition must exist where
// Multus looks for it. The NetworkAttachmentDefinition API is a real CRD.
func TestInspectChecksTheOpenShiftMultusLayout(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	e := newNodeEnv(t, cp, "istio-cni.conf", standaloneConf)
	binDir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "istio-cni"), "../../cmd/istio-cni").CombinedOutput()
	if err != nil {
		t.Fatalf("build the plugin: %v: %s", err, out)
	}
	e.dirs[binDir] = "BINDIR"
	emptyBin := t.TempDir()
	e.dirs[emptyBin] = "EMPTYBIN"

	pods := map[string]string{ // name -> annotation ("" none)
		"joined":      "istio-cni",
		"joined-ns":   "default/istio-cni@net1",
		"joined-json": `[{"name": "istio-cni", "namespace": "app"}]`,
		"not-joined":  "",
		"other-net":   "macvlan-conf",
	}
	i := 0
	for _, name := range []string{"joined", "joined-ns", "joined-json", "not-joined", "other-net"} {
		i++
		ip := netip.AddrFrom4([4]byte{10, 251, 9, byte(i)})
		var opts []podOpt
		if a := pods[name]; a != "" {
			opts = append(opts, withAnnotation(MultusNetworksAnnotation, a))
		}
		runCapturedPod(t, cp, e.cfg, injectedPod(name, opts...), ip)
	}

	check := func(t *testing.T, name string, args []string, code int, golden string, want ...string) {
		t.Helper()
		stdout, stderr, got := e.run(args...)
		if got != code {
			t.Errorf("exit code %d, want %d; stderr:\n%s\nstdout:\n%s", got, code, stderr, stdout)
		}
		for _, w := range want {
			if !strings.Contains(stdout, w) {
				t.Errorf("stdout lacks %q:\n%s", w, stdout)
			}
		}
		checkGolden(t, filepath.Join("testdata", "multus", golden+".golden"), stdout)
	}

	// Before the CRD exists: Multus is not set up at all.
	check(t, "no-crd", []string{"inspect", "app/joined", "--bin-dir", binDir}, 1, "no-crd.txt",
		"the NetworkAttachmentDefinition API (k8s.cni.cncf.io/v1) is not installed")

	postRaw(t, cp, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", nadCRD)
	deadline := time.Now().Add(30 * time.Second)
	for cp.AdminClient().Discovery().RESTClient().Get().AbsPath("/apis/k8s.cni.cncf.io/v1").Do(t.Context()).Error() != nil {
		if time.Now().After(deadline) {
			t.Fatal("NetworkAttachmentDefinition CRD never served")
		}
		time.Sleep(100 * time.Millisecond)
	}
	check(t, "nad-missing", []string{"inspect", "app/joined", "--bin-dir", binDir}, 1, "nad-missing.txt",
		"NetworkAttachmentDefinition app/istio-cni is missing")

	postRaw(t, cp, "/apis/k8s.cni.cncf.io/v1/namespaces/app/network-attachment-definitions",
		`{"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": "istio-cni", "namespace": "app"}}`)

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		golden string
		want   []string
	}{
		{"joined", []string{"inspect", "app/joined", "--bin-dir", binDir}, 0, "joined.txt",
			[]string{"Multus: NetworkAttachmentDefinition app/istio-cni exists", "Status: ok"}},
		{"joined-json", []string{"inspect", "app/joined-json", "--bin-dir", binDir, "-o", "json"}, 0, "joined.json",
			[]string{`"nadExists": true`}},
		{"nad-in-other-namespace", []string{"inspect", "app/joined-ns", "--bin-dir", binDir}, 1, "nad-in-other-namespace.txt",
			[]string{"NetworkAttachmentDefinition default/istio-cni is missing"}},
		{"not-joined", []string{"inspect", "app/not-joined", "--bin-dir", binDir}, 1, "not-joined.txt",
			[]string{"does not name the istio-cni network"}},
		{"other-network", []string{"inspect", "app/other-net", "--bin-dir", binDir}, 1, "other-network.txt",
			[]string{`(it is "macvlan-conf")`}},
		{"binary-missing", []string{"inspect", "app/joined", "--bin-dir", emptyBin}, 1, "binary-missing.txt",
			[]string{"PROBLEM: the plugin binary EMPTYBIN/istio-cni is missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) { check(t, tc.name, tc.args, tc.code, tc.golden, tc.want...) })
	}
	if _, err := os.Stat(filepath.Join(binDir, "istio-cni")); err != nil {
		t.Fatal(err)
	}

	// A standalone plugin has no previous result: its ADD and CHECK plan the
	// families its namespace holds, here an IPv6 address the pod's status does not
	// list (a Multus secondary network), with ISTIO_DUAL_STACK set. The doctor
	// plans as they do, so the pod is ok, not "different".
	t.Run("dual-stack-from-the-namespace", func(t *testing.T) {
		dual := injectedPod("dual", withAnnotation(MultusNetworksAnnotation, "istio-cni"), withProxyEnv("ISTIO_DUAL_STACK", "true"))
		kp, sb := runPod(t, cp, dual, netip.MustParseAddr("10.251.9.20"))
		if err := netns.Do(sb.path, func() error { return sandbox.LoopbackAddr(netip.MustParseAddr("fd00:251::20")) }); err != nil {
			t.Fatal(err)
		}
		// The plan as the standalone ADD makes it, from the namespace's addresses.
		pp, err := plugin.PlanFor(plugin.ArgsFor(kp), e.cfg, kp, nil, plugin.Sandbox{Netns: sb.path})
		if err != nil || pp.Plan == nil || pp.Plan.Family(redirect.IPv6) == nil {
			t.Fatalf("the standalone ADD's plan: %v, %+v (want IPv6 capture)", err, pp)
		}
		b, err := plugin.NewBackend(e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := capture.Apply(t.Context(), sb.path, b, pp.Plan); err != nil {
			t.Fatal(err)
		}
		check(t, "dual-stack-from-the-namespace", []string{"inspect", "app/dual", "--bin-dir", binDir}, 0, "dual-stack-from-the-namespace.txt", "Status: ok")
	})
}

func withProxyEnv(name, value string) podOpt {
	return func(p *corev1.Pod) {
		for i := range p.Spec.Containers {
			if p.Spec.Containers[i].Name == "istio-proxy" {
				p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: name, Value: value})
			}
		}
	}
}
