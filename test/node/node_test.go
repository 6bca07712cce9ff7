package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/test/harness/node"
)

const testImage = "istio-cni.local/testserver:v1"

// The test's pod range differs from the default so a developer's hack/node/up.sh
// node can run beside it.
var testPodCIDR = netip.MustParsePrefix("10.244.200.0/24")

// Bounds a healthy run stays far below on a busy two-core machine.
const (
	upBound       = 90 * time.Second
	podReadyBound = 60 * time.Second
	downBound     = 60 * time.Second
	parallelPods  = 10
)

func TestNodeUpRunsPodsOnPtpReachableFromHostAndDownLeavesHostAsItWas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (containerd, kubelet, network namespaces); run it with sudo")
	}
	before := hostView(t)
	state, err := os.MkdirTemp("/var/lib", "istio-cni-node-test-")
	if err != nil {
		t.Fatal(err)
	}
	server := buildTestServer(t)

	ctx := t.Context()
	n, err := node.Up(ctx, node.Options{StateDir: state, PodCIDR: testPodCIDR, Progress: testWriter{t}})
	if err != nil {
		os.RemoveAll(state)
		t.Fatalf("up: %v", err)
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			if t.Failed() {
				dumpLogs(t, n)
			}
			if err := n.Down(); err != nil {
				t.Errorf("down: %v", err)
			}
		}
	})
	t.Logf("up (binaries cached): %s", n.UpDuration().Round(time.Millisecond))
	if n.UpDuration() > upBound {
		t.Errorf("up took %s, want under %s", n.UpDuration(), upBound)
	}
	checkNodeReady(t, n)

	if err := n.ImportImage(ctx, testImage, map[string]string{"/testserver": server}, []string{"/testserver"}); err != nil {
		t.Fatal(err)
	}

	// One pod: scheduled, started on ptp, reached from the host, deleted through
	// kubelet (whose CNI DEL removes the host route).
	cs := n.Client()
	pod, took := runPod(ctx, t, cs, "first")
	t.Logf("first pod Ready in %s with IP %s", took.Round(time.Millisecond), pod.Status.PodIP)
	ip := checkPodIP(t, pod)
	checkReachable(t, ip, pod.Name)
	if !hasRoute(t, ip) {
		t.Errorf("no host route to pod IP %s: ptp did not set up the host side", ip)
	}
	deletePod(ctx, t, cs, pod.Name)
	if hasRoute(t, ip) {
		t.Errorf("host route to %s still there after the pod was deleted: no CNI DEL", ip)
	}

	// Pod start latency: several pods created at once, create -> Ready each.
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for i := range parallelPods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, took := runPod(ctx, t, cs, fmt.Sprintf("p%d", i))
			if p == nil {
				return
			}
			checkReachable(t, checkPodIP(t, p), p.Name)
			mu.Lock()
			lat = append(lat, took)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(lat) == parallelPods {
		slices.Sort(lat)
		t.Logf("pod create -> Ready over %d pods started together: p50 %s, max %s",
			len(lat), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}

	// Down with the pods still running: Down deletes them through kubelet.
	downed = true
	if err := n.Down(); err != nil {
		t.Errorf("down: %v", err)
	}
	t.Logf("down (with %d pods running): %s", parallelPods, n.DownDuration().Round(time.Millisecond))
	if n.DownDuration() > downBound {
		t.Errorf("down took %s, want under %s", n.DownDuration(), downBound)
	}
	if left := node.Leftovers(state, testPodCIDR); len(left) > 0 {
		t.Errorf("left on the host after down:\n%s", strings.Join(left, "\n"))
	}
	checkHostAsBefore(t, before)
}

// checkHostAsBefore reports every difference between hostView now and before.
func checkHostAsBefore(t *testing.T, before map[string]string) {
	t.Helper()
	after := hostView(t)
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("host changed: %s was %q, is %q", k, before[k], after[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			t.Errorf("host changed: %s appeared (%q)", k, after[k])
		}
	}
}

// hostView is what the node may touch outside its state dir, as comparable strings.
func hostView(t *testing.T) map[string]string {
	t.Helper()
	v := map[string]string{}
	for _, s := range []string{"net/ipv4/ip_forward", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
		"kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"} {
		data, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatal(err)
		}
		v["sysctl "+s] = strings.TrimSpace(string(data))
	}
	for _, p := range []string{"/var/lib/cni", "/run/containerd", "/var/log/containers", "/opt/containerd",
		"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/kubelet", "/var/lib/containerd", "/var/log/pods"} {
		_, err := os.Lstat(p)
		v["exists "+p] = fmt.Sprint(err == nil)
	}
	// The cgroup parents runc makes for containerd's k8s.io namespace.
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, d := range cgroups {
		v["exists "+d] = "true"
	}
	// Chains of the kinds kubelet and the CNI plugins would add; other tests on the
	// machine work in their own network namespaces.
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(tool).Output()
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, ":KUBE-") || strings.HasPrefix(line, ":CNI-") {
				v[tool+" chain "+strings.Fields(line)[0]] = "present"
			}
		}
	}
	return v
}

func buildTestServer(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "testserver")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testserver")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build testserver: %v\n%s", err, b)
	}
	return out
}

func checkNodeReady(t *testing.T, n *node.Node) {
	t.Helper()
	no, err := n.Client().CoreV1().Nodes().Get(t.Context(), n.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range no.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			t.Fatalf("node %s not Ready after Up: %s", no.Name, c.Message)
		}
	}
	if got, want := no.Status.NodeInfo.ContainerRuntimeVersion, "containerd://"+strings.TrimPrefix(n.Versions().Containerd, "v"); got != want {
		t.Errorf("container runtime %q, want %q (the containerd hack/runtime-binaries.sh built)", got, want)
	}
	if got, want := no.Status.NodeInfo.KubeletVersion, n.Versions().Kubelet; got != want {
		t.Errorf("kubelet version %q, want %q", got, want)
	}
}

// runPod creates a testserver pod (left to the scheduler) and waits until it is
// Ready; it returns the pod and the time from create to Ready seen by polling.
func runPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) (*corev1.Pod, time.Duration) {
	return runPodImage(ctx, t, cs, name, testImage)
}

func runPodImage(ctx context.Context, t *testing.T, cs kubernetes.Interface, name, image string) (*corev1.Pod, time.Duration) {
	t.Helper()
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "server",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			}},
		},
	}
	began := time.Now()
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Errorf("create pod %s: %v", name, err)
		return nil, 0
	}
	deadline := time.Now().Add(podReadyBound)
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && isReady(p) {
			return p, time.Since(began)
		}
		if time.Now().After(deadline) {
			t.Errorf("pod %s not Ready within %s: %v", name, podReadyBound, describe(p, err))
			return nil, 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func describe(p *corev1.Pod, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("phase %s, node %q, conditions %+v, containers %+v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
}

func checkPodIP(t *testing.T, p *corev1.Pod) netip.Addr {
	t.Helper()
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil || !testPodCIDR.Contains(ip) {
		t.Errorf("pod %s IP %q, want an address from ptp's range %s", p.Name, p.Status.PodIP, testPodCIDR)
	}
	return ip
}

// checkReachable GETs the pod's server from the host. The pod has no readiness
// probe, so Ready may come a moment before the server listens: a refused
// connection is tried again for up to 5 s.
func checkReachable(t *testing.T, ip netip.Addr, podName string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(5 * time.Second)
	resp, err := client.Get("http://" + netip.AddrPortFrom(ip, 8080).String() + "/")
	for err != nil && errors.Is(err, syscall.ECONNREFUSED) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		resp, err = client.Get("http://" + netip.AddrPortFrom(ip, 8080).String() + "/")
	}
	if err != nil {
		t.Errorf("GET pod %s at %s from the host: %v", podName, ip, err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if want := "pod " + podName + "\n"; string(body) != want {
		t.Errorf("pod %s at %s answered %q, want %q", podName, ip, body, want)
	}
}

func hasRoute(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	out, err := exec.Command("ip", "-4", "route", "show", ip.String()+"/32").Output()
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	return strings.TrimSpace(string(out)) != ""
}

func deletePod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if err := cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still present 30s after delete", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dumpLogs(t *testing.T, n *node.Node) {
	for _, name := range []string{"kubelet", "containerd", "kube-scheduler", "kube-controller-manager"} {
		data, err := os.ReadFile(filepath.Join(n.LogDir(), name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("last lines of %s.log:\n%s", name, strings.Join(lines, "\n"))
	}
}

// testWriter sends the node's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
