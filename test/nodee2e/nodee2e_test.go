package nodee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/test/harness/node"
	"github.com/istio-cni/istio-cni/test/harness/poll"
	"github.com/istio-cni/istio-cni/test/harness/repo"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// A state dir and pod range of their own: other nodes (hack/node/up.sh, make demo,
// test/node) may be up on this machine at the same time.
const stateDir = "/var/lib/istio-cni-nodee2e"

var (
	podCIDR   = netip.MustParsePrefix("10.244.210.0/24")
	podCIDRv6 = netip.MustParsePrefix("fd00:10:244:210::/64") // pods are dual-stack
)

var (
	theNode   *node.Node
	theImages *meshnode.Images
	theTools  meshnode.Tools
	theRoot   string
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/nodee2e: needs root (containerd, kubelet, network namespaces): run as root (sudo make test)")
		os.Exit(1)
	}
	code, err := setUp(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/nodee2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setUp(m *testing.M) (code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// One node at a time on this machine: nodes share host-wide state (libcni's
	// cache, cgroups), and each one's clean-up checks would see the other's.
	unlock, err := node.LockMachine()
	if err != nil {
		return 0, err
	}
	defer unlock()
	if theRoot, err = repo.Root(); err != nil {
		return 0, err
	}
	if theTools, err = meshnode.FindTools(ctx, theRoot); err != nil {
		return 0, err
	}
	work, err := os.MkdirTemp("", "nodee2e-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(work)
	if theImages, err = meshnode.BuildImages(ctx, theRoot, work, ""); err != nil {
		return 0, err
	}
	waitForOtherNodes(ctx, 5*time.Minute)
	if err := node.Cleanup(stateDir, podCIDR, os.Stderr); err != nil { // a node left by a killed run
		return 0, err
	}
	if theNode, err = node.Up(ctx, node.Options{StateDir: stateDir, PodCIDR: podCIDR, PodCIDRv6: podCIDRv6, NodeName: "nodee2e",
		// The burst test's 110 meshed pods (kubelet's default maximum) besides the agent.
		MaxPods: burstPods + 10}); err != nil {
		return 0, err
	}
	defer func() {
		if derr := theNode.Down(); derr != nil {
			fmt.Fprintln(os.Stderr, "test/nodee2e: node down:", derr)
			if code == 0 {
				code = 1
			}
		}
	}()
	if err := theImages.Import(ctx, theNode); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func session(t testing.TB) *meshnode.Session {
	return &meshnode.Session{Node: theNode, Tools: theTools, Root: theRoot, Out: testWriter{t}}
}

func values(t testing.TB, extra ...string) []string {
	v, err := meshnode.ChartValues(theNode, theImages)
	if err != nil {
		t.Fatal(err)
	}
	return append(v, extra...)
}

// install installs the chart and registers its uninstall; it returns the agent pod.
func install(t testing.TB, s *meshnode.Session, vals []string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	// Registered first: an install whose agent never gets ready is removed too.
	t.Cleanup(func() {
		// Whatever a failed test left: the next test starts from a node without the chart.
		if out, err := meshnode.Run(ctx, theNode, theTools.Helm, "status", meshnode.Release, "-n", meshnode.Namespace); err == nil && strings.Contains(out, "STATUS") {
			s.Uninstall(ctx)
		}
	})
	took, agent, err := s.Install(ctx, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("helm install -> agent Ready: %s", took)
	return agent
}

func createPods(t testing.TB, pods ...*corev1.Pod) []*corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	created, err := meshnode.CreatePods(ctx, theNode, pods...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range pods {
			theNode.Client().CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
		waitPodsGone(t, pods)
	})
	return created
}

func waitPodsGone(t testing.TB, pods []*corev1.Pod) { waitPodsGoneWithin(t, pods, 60*time.Second) }

// waitPodsGoneWithin waits, at most bound in all, until the pods are gone.
func waitPodsGoneWithin(t testing.TB, pods []*corev1.Pod, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for _, p := range pods {
		for time.Now().Before(deadline) {
			if _, err := theNode.Client().CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{}); err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// conflistPlugins are the plugins of the node's chained conflist, 10-ptp.conflist.
func conflistPlugins(t testing.TB) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(theNode.CNIConfDir(), "10-ptp.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("10-ptp.conflist: %v", err)
	}
	return c.Plugins
}

func conflistTypes(t testing.TB) []string {
	t.Helper()
	var types []string
	for _, p := range conflistPlugins(t) {
		types = append(types, fmt.Sprint(p["type"]))
	}
	return types
}

func istioEntry(t testing.TB) map[string]any {
	t.Helper()
	for _, p := range conflistPlugins(t) {
		if p["type"] == "istio-cni" {
			return p
		}
	}
	return nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, 50*time.Millisecond, what, cond)
}

// checkCapturedTraffic proves, for a meshed client and app, that both netns carry
// the capture and that a request goes out through the client's proxy and in
// through the app's.
func checkCapturedTraffic(t *testing.T, s *meshnode.Session, client, app *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []*corev1.Pod{client, app} {
		rules, err := s.ShowRules(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !meshnode.Captured(rules) {
			t.Errorf("pod %s/%s: no capture in its netns:\n%s", p.Namespace, p.Name, rules)
		}
	}
	checkRequestThroughProxies(t, s, client, app, net.JoinHostPort(app.Status.PodIP, "8080"), "127.0.0.6")
}

// checkRequestThroughProxies sends a request from client to the app at dst and
// proves it went out through the client's proxy and in through the app's, which
// passed it on from passthrough (its inbound passthrough address).
func checkRequestThroughProxies(t *testing.T, s *meshnode.Session, client, app *corev1.Pod, dst, passthrough string) {
	t.Helper()
	if err := requestThroughProxies(context.Background(), s, client, app, dst, passthrough); err != nil {
		t.Error(err)
	}
}

// requestThroughProxies is checkRequestThroughProxies returning what is wrong.
func requestThroughProxies(ctx context.Context, s *meshnode.Session, client, app *corev1.Pod, dst, passthrough string) error {
	answer, err := s.RequestTo(ctx, client, dst)
	if err != nil {
		return fmt.Errorf("request %s -> %s: %w", client.Name, dst, err)
	}
	if !strings.Contains(answer, "hello from "+app.Name) || !strings.Contains(answer, passthrough) {
		return fmt.Errorf("request %s -> %s: answer %q: want the app's name, seen from %s (its proxy's inbound passthrough)", client.Name, dst, answer, passthrough)
	}
	if log, ok := proxyLogHas(ctx, s, client, "outbound", dst); !ok {
		return fmt.Errorf("request %s -> %s: the client's proxy log has no outbound %s within %v:\n%s", client.Name, dst, dst, proxyLogBound, log)
	}
	if log, ok := proxyLogHas(ctx, s, app, "inbound", dst); !ok {
		return fmt.Errorf("request %s -> %s: the app's proxy log has no inbound %s within %v:\n%s", client.Name, dst, dst, proxyLogBound, log)
	}
	return nil
}

// proxyLogBound bounds the wait for a proxy's log line to be readable. The proxy
// writes the line before it relays the answer, but the runtime copies a container's
// output into its log file on its own time, which lags under load (a stop-phase
// run saw the answer arrive and the line not yet in the log).
const proxyLogBound = 10 * time.Second

// proxyLogHas reads p's proxy log until it shows a forwarded connection of direction
// to dst, at most proxyLogBound; it returns the last log read.
func proxyLogHas(ctx context.Context, s *meshnode.Session, p *corev1.Pod, direction, dst string) (string, bool) {
	deadline := time.Now().Add(proxyLogBound)
	for {
		log, _ := s.ProxyLog(ctx, p)
		if contains(meshnode.Forwarded(log, direction), dst) {
			return log, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return log, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func checkUntouched(t *testing.T, s *meshnode.Session, p, app *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	rules, err := s.ShowRules(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if meshnode.HasIstioRules(rules) {
		t.Errorf("pod %s/%s in an excluded namespace has ISTIO_ rules:\n%s", p.Namespace, p.Name, rules)
	}
	if _, err := s.Request(ctx, p, app); err != nil {
		t.Errorf("request from %s/%s: %v", p.Namespace, p.Name, err)
	}
	log, _ := s.ProxyLog(ctx, p)
	if out := meshnode.Forwarded(log, "outbound"); len(out) > 0 {
		t.Errorf("pod %s/%s: its traffic went through its proxy (%v)", p.Namespace, p.Name, out)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitForOtherNodes waits (up to max) while another node's kubelet runs on this
// machine, such as test/node's in the same `make test`: nodes share host settings
// (ip_forward, /run/containerd) that each restores when it goes down, so two at
// once can break each other. After max it goes ahead and says so.
func waitForOtherNodes(ctx context.Context, max time.Duration) {
	deadline := time.Now().Add(max)
	said := false
	for {
		others := otherKubelets()
		if len(others) == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "test/nodee2e: going ahead with other nodes up (%s)\n", strings.Join(others, ", "))
			return
		}
		if !said {
			fmt.Fprintf(os.Stderr, "test/nodee2e: waiting for other nodes on this machine to go down: %s\n", strings.Join(others, ", "))
			said = true
		}
		time.Sleep(time.Second)
	}
}

// otherKubelets lists the --root-dir of kubelets not under our state dir.
func otherKubelets() []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "kubelet" {
			continue
		}
		for _, a := range args {
			if dir, ok := strings.CutPrefix(a, "--root-dir="); ok && !strings.HasPrefix(dir, stateDir+"/") {
				out = append(out, dir)
			}
		}
	}
	return out
}
