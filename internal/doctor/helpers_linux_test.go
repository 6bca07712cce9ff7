package doctor

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/testns"

	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/test/harness/golden"
	"github.com/istio-cni/istio-cni/test/harness/pods"
)

const (
	testNS   = "app"
	thisNode = "node-a"
)

func startControlPlane(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	return controlplane.StartForTestWithNamespaces(t, controlplane.Options{}, testNS)
}

// podSandbox stands in for a pod's sandbox as the repair tests build it: a network
// namespace held only by a process inside it (the pause container), not
// bind-mounted anywhere the finder is told about, with the pod's address on lo and
// a veth pair (both ends inside) carrying the default route, so that an outbound
// connection leaves through an interface as in a real pod.
type podSandbox struct {
	proc *exec.Cmd
	// path enters the namespace (through the process) for the test's own setup.
	path string
}

func newPodSandbox(t testing.TB, ip netip.Addr) *podSandbox {
	t.Helper()
	// unshare(1) in a child: a process holds the pod's namespace, as in a real pod.
	bind := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(bind, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	ps := &podSandbox{proc: exec.Command("unshare", "--net="+bind, "sleep", "600")}
	if err := ps.proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ps.proc.Process.Kill()
		ps.proc.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		var st unix.Statfs_t
		if unix.Statfs(bind, &st) == nil && st.Type == unix.NSFS_MAGIC {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pod namespace never mounted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	addressPod(t, bind, ip)
	// Only the process holds it from now on, as with a runtime that bind-mounts
	// its namespaces somewhere the finder does not look.
	if err := testns.Delete(bind); err != nil {
		t.Fatal(err)
	}
	ps.path = "/proc/" + strconv.Itoa(ps.proc.Process.Pid) + "/ns/net"
	return ps
}

// newPodSandboxInUserNamespace is newPodSandbox for a pod with hostUsers: false: its
// network namespace belongs to a user namespace of its own (testns.NewInUserNamespace:
// the pod's ids 0-65535 are the node's from testns.UserNamespaceBase on), held by
// the process inside.
func newPodSandboxInUserNamespace(t testing.TB, ip netip.Addr) *podSandbox {
	t.Helper()
	path := testns.NewInUserNamespace(t)
	addressPod(t, path, ip)
	return &podSandbox{path: path}
}

// addressPod gives the pod's namespace at path its address on lo and the looped
// default route an outbound connection leaves by.
func addressPod(t testing.TB, path string, ip netip.Addr) {
	t.Helper()
	err := netns.Do(path, func() error {
		if err := sandbox.LoopbackAddr(ip); err != nil {
			return err
		}
		return sandbox.LoopedDefaultRoute()
	})
	if err != nil {
		t.Fatalf("pod namespace: %v", err)
	}
}

type podOpt = pods.Option

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func withAnnotation(k, v string) podOpt {
	return func(p *corev1.Pod) { p.Annotations[k] = v }
}
func withoutSidecar(p *corev1.Pod) {
	p.Spec.Containers = p.Spec.Containers[:1]
	delete(p.Annotations, "sidecar.istio.io/status")
}

// injectedPod is a pod as Istio's injector shapes it with the CNI enabled.
func injectedPod(name string, opts ...podOpt) *corev1.Pod {
	return pods.Injected(testNS, name, thisNode, opts...)
}

// createPod creates the pod and, playing the kubelet, reports ip as its address.
func createPod(t testing.TB, cp *controlplane.ControlPlane, p *corev1.Pod, ip netip.Addr) *kube.Pod {
	t.Helper()
	c := cp.AdminClient()
	got, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	got.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}
	if got, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of pod %s: %v", p.Name, err)
	}
	var kp kube.Pod
	kc, err := kube.LoadKubeconfig(cp.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	client, err := kube.NewClient(kc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Get(context.Background(), kube.PodPath(got.Namespace, got.Name), &kp); err != nil {
		t.Fatal(err)
	}
	return &kp
}

// runPod creates the pod with ip (createPod) and gives it a sandbox on the node
// that holds ip (newPodSandbox).
func runPod(t testing.TB, cp *controlplane.ControlPlane, p *corev1.Pod, ip netip.Addr) (*kube.Pod, *podSandbox) {
	t.Helper()
	return createPod(t, cp, p, ip), newPodSandbox(t, ip)
}

// runCapturedPod is runPod, and then the plugin's own path captures the pod
// (applyCapture).
func runCapturedPod(t testing.TB, cp *controlplane.ControlPlane, cfg *plugin.Config, p *corev1.Pod, ip netip.Addr) (*kube.Pod, *podSandbox) {
	t.Helper()
	kp, ns := runPod(t, cp, p, ip)
	applyCapture(t, cfg, kp, ns.path)
	return kp, ns
}

// applyCapture programs the pod's capture as the plugin's ADD does: its plan
// (plugin.PlanFor) and backend, through capture.Apply.
func applyCapture(t testing.TB, cfg *plugin.Config, pod *kube.Pod, nsPath string) {
	t.Helper()
	pp, err := plugin.PlanFor(plugin.ArgsFor(pod), cfg, pod, nil, plugin.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	plan := pp.Plan
	if plan == nil {
		t.Fatalf("pod %s is not captured: %s", pod.Key(), pp.Decision.Reason)
	}
	b, err := plugin.NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capture.Apply(t.Context(), nsPath, b, plan); err != nil {
		t.Fatal(err)
	}
}

var (
	procNetns = regexp.MustCompile(`/proc/\d+/ns/net`)
	inodeText = regexp.MustCompile(`inode \d+`)
	inodeJSON = regexp.MustCompile(`"netnsInode": \d+`)
)

// mask replaces what differs between runs: the sandbox's pid and namespace
// inode, and the test's temporary directories.
func mask(s string, dirs map[string]string) string {
	s = procNetns.ReplaceAllString(s, "/proc/PID/ns/net")
	s = inodeText.ReplaceAllString(s, "inode N")
	s = inodeJSON.ReplaceAllString(s, `"netnsInode": 0`)
	for dir, name := range dirs {
		s = strings.ReplaceAll(s, dir, name)
	}
	return s
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	golden.Check(t, path, []byte(got))
}

// toKubePod converts a pod manifest to the plugin's view of it.
func toKubePod(t testing.TB, p *corev1.Pod) *kube.Pod {
	t.Helper()
	kp, err := repair.KubePod(p)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}
