package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// nodeEnv is a node as the doctor sees it: a CNI config directory with istio-cni
// chained after the primary network, and the API server's admin kubeconfig.
type nodeEnv struct {
	cp      *controlplane.ControlPlane
	confDir string
	cfg     *plugin.Config
	dirs    map[string]string
}

func newNodeEnv(t *testing.T, cp *controlplane.ControlPlane, file, conf string) *nodeEnv {
	t.Helper()
	e := &nodeEnv{cp: cp, confDir: t.TempDir()}
	runDir := t.TempDir()
	conf = strings.ReplaceAll(conf, "RUNDIR", runDir)
	if err := os.WriteFile(filepath.Join(e.confDir, file), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := LoadConfDir(e.confDir)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = cfg
	e.dirs = map[string]string{e.confDir: "CONFDIR", runDir: "RUNDIR"}
	return e
}

// run runs a doctor command as on the node, with the node's flags.
func (e *nodeEnv) run(args ...string) (stdout, stderr string, code int) {
	args = append(args, "--kubeconfig", e.cp.AdminKubeconfig(), "--conf-dir", e.confDir, "--node-name", thisNode,
		"--proc-dir", "/proc", "--netns-dirs", "")
	if !containsFlag(args, "--bin-dir") {
		args = append(args, "--bin-dir", "")
	}
	var out, errb bytes.Buffer
	code = Main(args, nil, &out, &errb)
	return mask(out.String(), e.dirs), mask(errb.String(), e.dirs), code
}

func containsFlag(args []string, f string) bool {
	for _, a := range args {
		if a == f {
			return true
		}
	}
	return false
}

const chainedConflist = `{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "ptp", "ipam": {"type": "host-local", "subnet": "10.251.0.0/16"}},
    {"type": "istio-cni", "cni_agent_run_dir": "RUNDIR", "iptables_mode": "nft", "exclude_namespaces": ["kube-system"]}
  ]
}`

// TestInspectComparesLiveRulesWithWhatThePodRequires runs `inspect` against a real
// API server and real pod namespaces found through /proc by the pod's address:
// a pod captured by the plugin's own path (no differences), the same after a rule
// is deleted by hand (reported), a pod captured whose sidecar sets a variable
// that shapes the capture to no boolean (the ADD's warning, the rules as the
// capture takes it: false), a pod whose app runs as the proxy's uid (captured,
// the ADD's warning), a pod the plugin skips (says which rule), one the
// plugin skips that holds rules anyway, and the clear errors.
func TestInspectComparesLiveRulesWithWhatThePodRequires(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	e := newNodeEnv(t, cp, "10-k8s.conflist", chainedConflist)

	runCapturedPod(t, cp, e.cfg, injectedPod("web"), netip.MustParseAddr("10.251.7.1"))
	broken, brokenNS := runCapturedPod(t, cp, e.cfg, injectedPod("broken"), netip.MustParseAddr("10.251.7.2"))
	// By hand, as someone debugging might: the inbound jump and one exclusion go.
	testns.Run(t, brokenNS.path, exec.Command("iptables-nft", "-t", "nat", "-D", "PREROUTING", "-p", "tcp", "-j", "ISTIO_INBOUND"))
	testns.Run(t, brokenNS.path, exec.Command("iptables-nft", "-t", "nat", "-D", "ISTIO_OUTPUT", "-o", "lo", "-s", "127.0.0.6/32", "-j", "RETURN"))

	runCapturedPod(t, cp, e.cfg, injectedPod("dns-yes", withProxyEnv(plugin.EnvDNSCapture, "yes"), withProxyEnv(plugin.EnvInvalidDrop, "on ")),
		netip.MustParseAddr("10.251.7.7"))

	// The app runs as the proxy's uid: captured, as by Istio's plugin, and warned of.
	runCapturedPod(t, cp, e.cfg, injectedPod("vault", func(p *corev1.Pod) {
		uid := int64(1337)
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: &uid}
	}), netip.MustParseAddr("10.251.7.8"))

	runPod(t, cp, injectedPod("plain", withoutSidecar), netip.MustParseAddr("10.251.7.3"))

	// Skipped by the plugin (no sidecar), yet captured: someone ran istio-iptables.
	_, strayNS := runPod(t, cp, injectedPod("stray", withoutSidecar), netip.MustParseAddr("10.251.7.4"))
	applyCapture(t, e.cfg, toKubePod(t, injectedPod("stray")), strayNS.path)

	createPod(t, cp, injectedPod("elsewhere", onNode("node-b")), netip.MustParseAddr("10.251.7.5"))
	createPod(t, cp, injectedPod("gone"), netip.MustParseAddr("10.251.7.6")) // no sandbox on the node

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		golden string // testdata/inspect/NAME.golden of stdout
		stderr string // required in stderr
	}{
		{name: "correct", args: []string{"inspect", "app/web"}, code: 0, golden: "correct.txt"},
		{name: "correct-json", args: []string{"inspect", "app/web", "-o", "json"}, code: 0, golden: "correct.json"},
		{name: "rule-deleted", args: []string{"inspect", "app/broken"}, code: 1, golden: "rule-deleted.txt"},
		{name: "env-not-boolean", args: []string{"inspect", "app/dns-yes"}, code: 0, golden: "env-not-boolean.txt"},
		{name: "env-not-boolean-json", args: []string{"inspect", "app/dns-yes", "-o", "json"}, code: 0, golden: "env-not-boolean.json"},
		{name: "proxy-uid-shared", args: []string{"inspect", "app/vault"}, code: 0, golden: "proxy-uid-shared.txt"},
		{name: "not-meshed", args: []string{"inspect", "app/plain"}, code: 3, golden: "not-meshed.txt"},
		{name: "not-meshed-with-rules", args: []string{"inspect", "app/stray"}, code: 1, golden: "not-meshed-with-rules.txt"},
		{name: "other-node", args: []string{"inspect", "app/elsewhere"}, code: 1,
			stderr: `pod app/elsewhere runs on node "node-b", this is node "node-a"`},
		{name: "missing", args: []string{"inspect", "app/nosuch"}, code: 1, stderr: "pod app/nosuch not found in the API server"},
		{name: "no-netns", args: []string{"inspect", "app/gone"}, code: 1,
			stderr: "network namespace of pod app/gone not found on this node: no network namespace on this node holds the pod's address (looked for 10.251.7.6"},
		{name: "bad-ref", args: []string{"inspect", "web"}, code: 2, stderr: `"web": want NAMESPACE/POD`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := e.run(tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s\nstdout:\n%s", code, tc.code, stderr, stdout)
			}
			if tc.stderr != "" && !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q lacks %q", stderr, tc.stderr)
			}
			if tc.golden != "" {
				checkGolden(t, filepath.Join("testdata", "inspect", tc.golden+".golden"), stdout)
			}
		})
	}

	// What inspect reports missing is what the plugin's CHECK would fail on, and
	// putting the rules back (the plugin's own apply) makes inspect pass again.
	applyCapture(t, e.cfg, broken, brokenNS.path)
	if stdout, stderr, code := e.run("inspect", "app/broken"); code != 0 || !strings.Contains(stdout, "Rules: as the pod requires") {
		t.Errorf("after re-applying: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestRunInReturnsWhenItsContextEndsThoughAChildHoldsItsOutput: a save tool that
// is a wrapper whose child hangs and holds the output pipe is killed at the
// context's end (the doctor's --timeout), and runIn returns within
// iptables.RunWaitDelay of it rather than waiting for the child.
func TestRunInReturnsWhenItsContextEndsThoughAChildHoldsItsOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	// The child outlives the test's bound below, then exits by itself.
	go func() { _, err := runIn(ctx, "/bin/sh", "-c", "sleep 30 & wait"); errc <- err }()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("a tool killed at the context's end: no error")
		}
	case <-time.After(100*time.Millisecond + iptables.RunWaitDelay + 5*time.Second):
		t.Fatal("runIn still waits for the killed tool's child, which holds its output")
	}
}

// TestInspectReadsItsRulesAtOneMoment: the live rules inspect shows, their
// differences from the pod's plan and the stray rules are read under one hold
// of the namespace's apply lock (capture.Read). While an apply holds the lock
// (here the test, from another descriptor of the namespace) and changes the
// rules before it lets go, inspect waits, and then shows the rules it judged:
// the hook rule the apply's step removed is missing from the rules shown as
// from the differences. Before, the rules shown were read at once, outside the
// lock, and the differences after the apply's end: the rules shown still held
// the rule the differences said was missing.
func TestInspectReadsItsRulesAtOneMoment(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	e := newNodeEnv(t, cp, "10-k8s.conflist", chainedConflist)
	_, ns := runCapturedPod(t, cp, e.cfg, injectedPod("web"), netip.MustParseAddr("10.251.8.1"))

	held, let, holderDone := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		holderDone <- netns.DoWithFD(ns.path, func(fd int) error {
			release, err := applylock.Take(applylock.InNamespace(context.Background(), fd))
			held <- err
			if err != nil {
				return err
			}
			<-let
			release()
			return nil
		})
	}()
	if err := <-held; err != nil {
		t.Fatalf("hold the namespace's apply lock: %v", err)
	}
	type result struct {
		stdout, stderr string
		code           int
		took           time.Duration
	}
	inspected := make(chan result, 1)
	start := time.Now()
	go func() {
		stdout, stderr, code := e.run("inspect", "app/web", "-o", "json")
		inspected <- result{stdout, stderr, code, time.Since(start)}
	}()
	// Inspect finds the pod and its namespace, and waits for the lock; then the
	// apply's step, and the apply lets go.
	const hold = 1500 * time.Millisecond
	time.Sleep(hold)
	const hook = "-A PREROUTING -p tcp -j ISTIO_INBOUND"
	testns.Run(t, ns.path, exec.Command("iptables-nft", "-t", "nat", "-D", "PREROUTING", "-p", "tcp", "-j", "ISTIO_INBOUND"))
	close(let)
	if err := <-holderDone; err != nil {
		t.Fatal(err)
	}

	r := <-inspected
	if r.took < hold {
		t.Errorf("inspect returned after %v, while the apply held the lock for %v: it did not wait", r.took, hold)
	}
	var in struct {
		Live        map[string]string `json:"live"`
		Differences []string          `json:"differences"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil {
		t.Fatalf("inspect (exit %d): %v\nstdout:\n%s\nstderr:\n%s", r.code, err, r.stdout, r.stderr)
	}
	missing := "ipv4: table nat: hook rule missing: " + hook
	if !slices.Contains(in.Differences, missing) {
		t.Errorf("differences %q lack %q", in.Differences, missing)
	}
	if live := in.Live["iptables ipv4"]; strings.Contains(live, hook) {
		t.Errorf("the rules shown hold %q, which the differences say is missing: read outside the lock, before the apply's end:\n%s", hook, live)
	}
}
