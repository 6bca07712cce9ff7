// Package e2e runs the istio-cni plugin the way a container runtime does: libcni
// executes a conflist chain of the reference plugins (ptp + host-local) and istio-cni
// into real network namespaces, for pods that exist in a real kube-apiserver, and
// real traffic proves the redirection.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	localnode "github.com/istio-cni/istio-cni/test/harness/node"
	"github.com/istio-cni/istio-cni/test/harness/repo"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

var (
	// pluginDir is CNI_PATH: the freshly built istio-cni and the reference plugins.
	pluginDir string
	// selfExe is a copy of this test binary that probes running as other uids can run.
	selfExe string
	// shared is the control plane most tests use.
	shared *controlplane.ControlPlane
)

// buildAsShipped builds target (a package, or a main file) in dir into out as the
// plugin ships: static (no dynamic loader on the per-pod exec path) and stripped.
func buildAsShipped(dir, out, target string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, target)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w: %s", target, err, strings.TrimSpace(string(msg)))
	}
	return nil
}

// initTrace runs bin's VERSION with GODEBUG=inittrace=1 and returns the runtime's
// account of its package initialisation: each package in the order initialised,
// with its init's clock time.
func initTrace(bin string) ([]initRecord, string, error) {
	cmd := exec.Command(bin)
	cmd.Env = []string{"GODEBUG=inittrace=1", "CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String(), fmt.Errorf("VERSION: %w: %s", err, stderr.String())
	}
	var recs []initRecord
	for _, line := range strings.Split(stderr.String(), "\n") {
		// init PKG @T ms, D ms clock, B bytes, A allocs
		if f := strings.Fields(line); len(f) >= 7 && f[0] == "init" && f[6] == "clock," {
			ms, err := strconv.ParseFloat(f[4], 64)
			if err != nil {
				return nil, stderr.String(), fmt.Errorf("init trace line %q: %w", line, err)
			}
			recs = append(recs, initRecord{pkg: f[1], took: time.Duration(ms * float64(time.Millisecond))})
		}
	}
	if len(recs) == 0 {
		// A runtime whose trace reads otherwise would give no init time at all.
		return nil, stderr.String(), fmt.Errorf("VERSION under GODEBUG=inittrace=1 printed no init line we read: %s", stderr.String())
	}
	return recs, stderr.String(), nil
}

// initRecord is one package's initialisation in an init trace.
type initRecord struct {
	pkg  string
	took time.Duration
}

// installCopy writes a copy of the binary at src to dst with write(2), as the
// agent installs binaries on a node and as a runtime extracts an image. A binary
// is exec'd from that copy, never from the linker's output: the Go linker writes
// its output through a memory mapping, and on this kernel (6.18, ext4) exec'ing
// that file cost 0.35 ms more than a copy of the same bytes (2.81 against 2.45 ms
// for an excluded ADD, 300 interleaved runs; the same after a sync), presumably
// from how the file's pages are held in the page cache.
func installCopy(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

func TestMain(m *testing.M) {
	sandbox.RunChildIfAsked()
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Geteuid() != 0 {
		return 0, fmt.Errorf("the end-to-end tests need root (network namespaces, netfilter); run them as root, as CI does")
	}
	// ptp runs in the host's network namespace here and turns on forwarding:
	// hold the machine's node lock so no node test sees it, and put it back.
	unlock, err := localnode.LockMachine()
	if err != nil {
		return 0, err
	}
	defer unlock()
	restore, err := localnode.SaveSysctls(localnode.ForwardingSysctls...)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := restore(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	}()
	dir, err := os.MkdirTemp("", "istio-cni-e2e")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	pluginDir = filepath.Join(dir, "bin")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return 0, err
	}
	root, err := repo.Root()
	if err != nil {
		return 0, err
	}
	// Built as it ships: static (no dynamic loader on the per-pod exec path) and
	// stripped; then copied into CNI_PATH, as the agent installs it (see installCopy).
	built := filepath.Join(dir, "build", "istio-cni")
	if err := buildAsShipped(root, built, "./cmd/istio-cni"); err != nil {
		return 0, err
	}
	if err := installCopy(built, filepath.Join(pluginDir, "istio-cni")); err != nil {
		return 0, err
	}
	out, err := exec.Command(filepath.Join(root, "hack", "cni-plugins.sh")).Output()
	if err != nil {
		return 0, fmt.Errorf("reference plugins (hack/cni-plugins.sh): %w", err)
	}
	refDir := strings.TrimSpace(string(out))
	for _, p := range []string{"ptp", "host-local", "loopback"} {
		if err := installCopy(filepath.Join(refDir, p), filepath.Join(pluginDir, p)); err != nil {
			return 0, err
		}
	}
	exe, exeDir, err := sandbox.ExecutableCopy()
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(exeDir)
	selfExe = exe

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	shared, err = controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return 0, err
	}
	defer shared.Stop()
	return m.Run(), nil
}

// pluginRBAC is the plugin's RBAC, as the chart grants it: it may get pods and
// namespaces (ambient mode's namespace label) and nothing else.
var pluginRBAC = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get"}}}

// node is one simulated node: a namespace playing the host, a CNI config, and the
// plugin's run directory with its kubeconfig.
type node struct {
	t  *testing.T
	cp *controlplane.ControlPlane
	ns string // the node's (host) network namespace
	// svcPort is where a service on the node side listens, for outbound probes.
	svcPort int
	dir     string
	runDir  string
	cni     *libcni.CNIConfig
	stderr  *logbuf.Buffer
	subnet  int
}

// pluginExec runs plugins like libcni's default, keeping their stderr (the plugin's
// logs) for the test's report.
type pluginExec struct {
	*invoke.RawExec
	version.PluginDecoder
}

var subnetSeq struct {
	sync.Mutex
	n int
}

func newNode(t *testing.T, cp *controlplane.ControlPlane) *node {
	t.Helper()
	dir := shortdir.New(t) // the agent's sockets go in it
	n := &node{t: t, cp: cp, dir: dir, runDir: filepath.Join(dir, "run"), stderr: &logbuf.Buffer{}}
	subnetSeq.Lock()
	subnetSeq.n++
	n.subnet = subnetSeq.n
	subnetSeq.Unlock()
	// The runtime runs plugins in the host's namespace, where the API server is
	// reachable; ptp puts its host-side veth and routes there, and they go away with
	// each pod's namespace.
	n.ns = "/proc/self/ns/net"
	n.svcPort = 20000 + n.subnet
	svc, err := sandbox.Serve(n.ns, 0, "node", "tcp4", fmt.Sprintf("0.0.0.0:%d", n.svcPort), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	writeRunDir(t, cp, n.runDir)
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(dir, "cache"), &pluginExec{RawExec: &invoke.RawExec{Stderr: n.stderr}})
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("E2E_PLUGIN_LOGS") != "" {
			t.Logf("plugin stderr:\n%s", n.stderr.String())
		}
	})
	return n
}

// writeRunDir makes the agent's run directory holding the plugin's kubeconfig, as
// the agent would write it: the ServiceAccount istio-system/istio-cni of cp, which
// may only get pods and namespaces.
func writeRunDir(tb testing.TB, cp *controlplane.ControlPlane, runDir string) {
	tb.Helper()
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	kc, err := cp.ServiceAccountKubeconfig(tb.Context(), "istio-system", "istio-cni", pluginRBAC)
	if err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(kc)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "istio-cni-kubeconfig"), data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// istioEntry is the istio-cni entry of the chain in Istio's current format.
func (n *node) istioEntry(extra map[string]any) map[string]any {
	e := map[string]any{
		"type":               "istio-cni",
		"plugin_log_level":   "debug",
		"cni_agent_run_dir":  n.runDir,
		"exclude_namespaces": []string{"istio-system", "kube-system"},
		"pod_namespace":      "istio-system",
		"pod_lookup":         map[string]any{"retries": 3, "interval": "200ms"},
		"log_socket":         "",
	}
	for k, v := range extra {
		e[k] = v
	}
	return e
}

func (n *node) ptpEntry() map[string]any {
	return map[string]any{
		"type": "ptp", "mtu": 1500,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": filepath.Join(n.dir, "ipam"),
			"ranges": []any{[]any{map[string]any{"subnet": fmt.Sprintf("10.%d.%d.0/24", 200+n.subnet/250, n.subnet%250)}}},
			"routes": []any{map[string]any{"dst": "0.0.0.0/0"}},
		},
	}
}

// chain builds the conflist a runtime reads: ptp, then istio-cni.
func (n *node) chain(istio map[string]any) *libcni.NetworkConfigList {
	n.t.Helper()
	raw, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "k8s-pod-network", "plugins": []any{n.ptpEntry(), istio}})
	if err != nil {
		n.t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		n.t.Fatalf("conflist: %v", err)
	}
	return l
}

// sandboxPod is a pod's network namespace and its runtime identity.
type sandboxPod struct {
	ns, name, uid string
	netns         string
	containerID   string
	ip            netip.Addr
	gw            netip.Addr
}

func (n *node) runtimeConf(p *sandboxPod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.containerID, NetNS: p.netns, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.ns}, {"K8S_POD_NAME", p.name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.containerID}, {"K8S_POD_UID", p.uid}},
	}
}

// newSandbox makes a network namespace for pod (like the runtime's pause sandbox).
func (n *node) newSandbox(pod *corev1.Pod) *sandboxPod {
	n.t.Helper()
	id := fmt.Sprintf("%x", time.Now().UnixNano())
	path, err := testns.New(n.dir, "pod-"+id)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { testns.Delete(path) })
	return &sandboxPod{ns: pod.Namespace, name: pod.Name, uid: string(pod.UID), netns: path, containerID: "c" + id}
}

// addJSON runs ADD like add, with the runtime's arguments rt, and returns the
// result as the runtime receives it: JSON in the config's spec version.
func (n *node) addJSON(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) ([]byte, error) {
	var out []byte
	err := netns.Do(n.ns, func() error {
		r, err := n.cni.AddNetworkList(context.Background(), list, rt)
		if err == nil {
			out, err = json.Marshal(r)
		}
		return err
	})
	return out, err
}

// wantNoRules checks that the pod's namespace holds none of our iptables rules;
// after says what should have left none.
func wantNoRules(t *testing.T, sb *sandboxPod, after string) {
	t.Helper()
	if out := runIn(t, sb.netns, "iptables-save"); strings.Contains(out, "ISTIO_") {
		t.Errorf("%s left rules:\n%s", after, out)
	}
	if out := runIn(t, sb.netns, "nft", "list", "ruleset"); strings.Contains(out, nftables.TablePrefix) {
		t.Errorf("%s left nftables tables:\n%s", after, out)
	}
}

// addPod makes a sandbox for pod and runs ADD for list in it, failing t on an error.
func (n *node) addPod(t *testing.T, list *libcni.NetworkConfigList, pod *corev1.Pod) (*sandboxPod, *types100.Result) {
	t.Helper()
	sb := n.newSandbox(pod)
	res, err := n.add(list, sb)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	return sb, res
}

// add runs ADD for the whole chain inside the node's namespace, as the runtime does.
func (n *node) add(list *libcni.NetworkConfigList, p *sandboxPod) (*types100.Result, error) {
	var res *types100.Result
	err := netns.Do(n.ns, func() error {
		r, err := n.cni.AddNetworkList(context.Background(), list, n.runtimeConf(p))
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	})
	if err == nil && res != nil {
		for _, ip := range res.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok {
				p.ip = a
				p.gw, _ = netip.AddrFromSlice(ip.Gateway.To4())
			}
		}
	}
	return res, err
}

func (n *node) del(list *libcni.NetworkConfigList, p *sandboxPod) error {
	return netns.Do(n.ns, func() error { return n.cni.DelNetworkList(context.Background(), list, n.runtimeConf(p)) })
}

func (n *node) check(list *libcni.NetworkConfigList, p *sandboxPod) error {
	return netns.Do(n.ns, func() error { return n.cni.CheckNetworkList(context.Background(), list, n.runtimeConf(p)) })
}

// meshedPod is a pod as Istio's injector leaves it: app and istio-proxy containers
// and the sidecar status annotation.
func meshedPod(ns, name string, annotations map[string]string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	ann := map[string]string{"sidecar.istio.io/status": `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`}
	for k, v := range annotations {
		ann[k] = v
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{
				{Name: "app", Image: "app:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}},
				{Name: "istio-proxy", Image: "proxyv2:1", Args: []string{"proxy", "sidecar"}},
			},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

// createPod stores the pod in the API server (no scheduler or kubelet is needed:
// spec.nodeName is set) and returns it with its UID.
func createPod(t testing.TB, cp *controlplane.ControlPlane, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := cp.EnsureNamespace(t.Context(), p.Namespace); err != nil {
		t.Fatal(err)
	}
	created, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return created
}

// serveTraffic starts the listeners of the traffic checks: the proxy's capture ports
// and the app in the pod, a service on the node side.
func serveTraffic(t *testing.T, n *node, p *sandboxPod) {
	t.Helper()
	for _, l := range []struct{ ns, name, addr string }{
		{p.netns, "outbound", "0.0.0.0:15001"}, {p.netns, "inbound", "0.0.0.0:15006"},
		{p.netns, "app", "0.0.0.0:8080"},
	} {
		c, err := sandbox.Serve(l.ns, 0, l.name, "tcp4", l.addr, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// landings sends the two flows that show whether a pod is captured: from the node to
// the app's port (inbound), and from the app (uid 1000) to a service on the node.
func landings(t *testing.T, n *node, p *sandboxPod) (inbound, outbound string) {
	t.Helper()
	inbound = sandbox.ProbeFrom(n.ns, "tcp", netip.AddrPortFrom(p.ip, 8080))
	out, err := sandbox.ProbeAs(p.netns, selfExe, 1000, "tcp", netip.AddrPortFrom(p.gw, uint16(n.svcPort)), "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	return inbound, out
}

// podIPv6 is the pod's IPv6 address in an ADD result.
func podIPv6(t *testing.T, res *types100.Result) netip.Addr {
	t.Helper()
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Is6() && !a.Is4In6() {
			return a
		}
	}
	t.Fatalf("no IPv6 address in %+v", res.IPs)
	return netip.Addr{}
}

// expectIPv6Captured checks that the pod has IPv6 capture rules and that IPv6
// inbound traffic to v6 reaches the proxy's inbound port.
func expectIPv6Captured(t *testing.T, n *node, sb *sandboxPod, v6 netip.Addr) {
	t.Helper()
	if out := runIn(t, sb.netns, "ip6tables-save"); !strings.Contains(out, "-j ISTIO_INBOUND") {
		t.Fatalf("no IPv6 capture:\n%s", out)
	}
	c, err := sandbox.Serve(sb.netns, 0, "inbound", "tcp6", "[::]:15006", false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, want := sandbox.ProbeFrom(n.ns, "tcp", netip.AddrPortFrom(v6, 8080)), fmt.Sprintf("inbound [%s]:8080", v6); got != want {
		t.Errorf("IPv6 inbound landed on %q, want %q (through the proxy)", got, want)
	}
}

func expectCaptured(t *testing.T, n *node, p *sandboxPod) {
	t.Helper()
	in, out := landings(t, n, p)
	if want := fmt.Sprintf("inbound %s:8080", p.ip); in != want {
		t.Errorf("inbound to the app landed on %q, want %q", in, want)
	}
	if want := fmt.Sprintf("outbound %s:%d", p.gw, n.svcPort); out != want {
		t.Errorf("outbound from the app landed on %q, want %q", out, want)
	}
}

func expectNotCaptured(t *testing.T, n *node, p *sandboxPod) {
	t.Helper()
	in, out := landings(t, n, p)
	if !strings.HasPrefix(in, "app ") {
		t.Errorf("inbound to the app landed on %q, want the app itself", in)
	}
	if !strings.HasPrefix(out, "node ") {
		t.Errorf("outbound from the app landed on %q, want the node's service", out)
	}
}

// addIstioAgain runs istio-cni's ADD alone, with prev as its previous result.
func (n *node) addIstioAgain(extra map[string]any, p *sandboxPod, prev *types100.Result) error {
	entry := n.istioEntry(extra)
	entry["cniVersion"] = "1.1.0"
	entry["name"] = "k8s-pod-network"
	entry["prevResult"] = prev
	stdin, err := json.Marshal(entry)
	if err != nil {
		return err
	}
	rt := n.runtimeConf(p)
	args := &invoke.Args{Command: "ADD", ContainerID: rt.ContainerID, NetNS: rt.NetNS, IfName: rt.IfName, PluginArgs: rt.Args, Path: pluginDir}
	_, err = invoke.ExecPluginWithResult(context.Background(), filepath.Join(pluginDir, "istio-cni"), stdin, args, &pluginExec{RawExec: &invoke.RawExec{Stderr: n.stderr}})
	return err
}
