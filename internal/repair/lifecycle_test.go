package repair

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// setEnded plays the kubelet ending a pod whose validation was failing, in one
// status update: its phase (and reason), the validation's failure and the pod's
// address kept, as the kubelet keeps them on a terminal pod.
func setEnded(t testing.TB, c kubernetes.Interface, p *corev1.Pod, ip string, phase corev1.PodPhase, reason string) {
	t.Helper()
	p = p.DeepCopy()
	p.Status = corev1.PodStatus{
		Phase: phase, Reason: reason,
		PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: DefaultInitContainerName, Image: "proxyv2", RestartCount: 3,
			State:                corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error"}},
		}},
	}
	if _, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("end pod %s: %v", p.Name, err)
	}
}

// TestATerminalPodIsNotRepairedIntoTheNamespaceThatNowHoldsItsAddress: a pod that
// ended (evicted here while its validation was failing; a node shutdown or
// activeDeadlineSeconds alike) keeps its failed validation and its address in its
// status, and stays on the node until the pod GC removes it. Its containers never
// run again, so an in-place repair cannot help it; and its sandbox is gone, so its
// address may already be another pod's. Repairing it in place programmed the
// capture of the dead pod into that other pod's network namespace, redirecting its
// traffic to a proxy it does not run. It is now not repaired in place, as a pod
// with restartPolicy Never is not, and says why.
func TestATerminalPodIsNotRepairedIntoTheNamespaceThatNowHoldsItsAddress(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	ip := netip.MustParseAddr("10.251.5.10")
	// The sandbox of the pod that got the address after the evicted pod's went away.
	other := newPodNetns(t, t.TempDir(), "other-pod", ip, true, true)

	cfg := testConfig("node-terminal")
	c := runController(t, cfg, clientWithRules(t, cp, "repair-terminal", rulesFor(cfg)),
		inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))

	setEnded(t, admin, createPod(t, admin, injectedPod("evicted", cfg.NodeName)), ip.String(), corev1.PodFailed, "Evicted")
	setEnded(t, admin, createPod(t, admin, injectedPod("done", cfg.NodeName)), "10.251.5.11", corev1.PodSucceeded, "")
	for _, name := range []string{"evicted", "done"} {
		if ev := waitEvent(t, admin, name, ReasonRepairBrokenPod); !strings.HasPrefix(ev, "Warning ") || !strings.Contains(ev, "not repaired in place: the pod has ended") {
			t.Errorf("terminal pod %s: event %q, want a warning saying it is not repaired in place because it has ended", name, ev)
		}
	}
	if rules := iptablesSave(t, other.bind); strings.Contains(rules, "ISTIO_") {
		t.Errorf("the namespace now holding the evicted pod's address %s got the evicted pod's capture:\n%s", ip, rules)
	}
	m := c.Metrics()
	wantCount(t, "repair/skip", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSkip) }, 2)
	if got := m.PodsRepaired(ActionRepair, ResultSuccess) + m.PodsRepaired(ActionRepair, ResultFail); got != 0 {
		t.Errorf("%d in-place repairs tried, want none", got)
	}
	if got := m.NetnsScans.Load(); got != 0 {
		t.Errorf("namespaces searched %d times for terminal pods", got)
	}
}

// TestAPodRepairedOnceIsRepairedAgainInItsNextSandbox: the kubelet gives a pod a
// new sandbox (a new network namespace, mostly a new address, the same pod and
// uid) when its sandbox dies, and its init containers run again there. A new
// sandbox set up while the plugin was out of the node's chain (the primary CNI
// rewrote its config, say) fails its validation as the first one did. The
// controller remembered the pod as repaired by name and uid for as long as the pod
// lived, so it took the new failure for the old one, never programmed the new
// namespace, and the pod stayed broken until the agent restarted.
func TestAPodRepairedOnceIsRepairedAgainInItsNextSandbox(t *testing.T) {
	e := startInPlace(t, "node-resandbox", "repair-resandbox", netip.MustParseAddr("10.251.6.10"))
	admin, dir, cfg, m, first, firstNs := e.admin, e.dir, e.cfg, e.m, e.first, e.firstNs

	pod := createPod(t, admin, injectedPod("web", cfg.NodeName))
	pod = setValidation(t, admin, pod, first.String(), 126, "")
	wantCount(t, "repair/success in the first sandbox", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 1)
	wantCaptured(t, "first sandbox", firstNs.bind)
	// The validation re-runs and passes; the pod runs.
	pod = setValidation(t, admin, pod, first.String(), 0, "")

	// The sandbox dies; the kubelet makes a new one, which the plugin missed.
	second := netip.MustParseAddr("10.251.6.11")
	secondNs := newPodNetns(t, dir, "second-sandbox", second, true, true)
	setValidation(t, admin, pod, second.String(), 126, "")

	waitFor(t, "the second sandbox captured", 20*time.Second, func() (bool, error) {
		return strings.Contains(iptablesSave(t, secondNs.bind), ":ISTIO_OUTPUT"), nil
	})
	wantCount(t, "repair/success", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 2)
}

// inPodCgroup moves pid into a cgroup named as the kubelet names a pod's, rel
// below a directory of this test's own in the pids hierarchy (cgroup v1) or the
// unified one (v2), and back to the root, the directories removed, at the end.
func inPodCgroup(t testing.TB, pid int, rel string) {
	t.Helper()
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		root = "/sys/fs/cgroup"
	}
	top, err := os.MkdirTemp(root, "istio-cni-repair-test-")
	if err != nil {
		t.Fatalf("cgroup: %v", err)
	}
	leaf := filepath.Join(top, rel)
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		os.Remove(top)
		t.Fatalf("cgroup: %v", err)
	}
	t.Cleanup(func() {
		// Back to the root, a process gone already aside.
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		for d := leaf; strings.HasPrefix(d, top); d = filepath.Dir(d) {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move %d into cgroup %s: %v", pid, leaf, err)
	}
}

// TestAnAddressNowHeldByAnotherPodsSandboxIsNotRepairedIntoIt: a broken pod's
// status, and the agent's cache of it, lag the node. When its sandbox dies (or
// the pod is deleted while the agent's watch is behind), the network plugin gives
// its address to the next pod that starts, while the status still shows it. An
// in-place repair found that pod's namespace by the address and programmed the
// broken pod's capture into it, redirecting a pod that may run no proxy. The
// kubelet's cgroup of the namespace's pause process names the pod it belongs to:
// a namespace that is another pod's is now refused (retried, then given up on,
// saying why), while the pod's own namespace, and a static pod's by its mirror's
// annotation, are repaired as before.
func TestAnAddressNowHeldByAnotherPodsSandboxIsNotRepairedIntoIt(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	dir := t.TempDir()

	cfg := testConfig("node-reused-address")
	c := runController(t, cfg, clientWithRules(t, cp, "repair-reused-address", rulesFor(cfg)),
		inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))
	m := c.Metrics()

	// The address in the broken pod's status is held now by another pod's sandbox
	// (cgroupfs driver's names).
	reused := netip.MustParseAddr("10.251.7.10")
	otherNs := newPodNetns(t, dir, "other-pod", reused, true, true)
	inPodCgroup(t, otherNs.proc.Process.Pid, "kubepods/besteffort/pod1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d/sandbox-other")

	pod := createPod(t, admin, injectedPod("web", cfg.NodeName))
	pod = setValidation(t, admin, pod, reused.String(), 126, "")
	waitFor(t, "the repair given up on, or done", 20*time.Second, func() (bool, error) {
		return m.GaveUp.Load() > 0 || m.PodsRepaired(ActionRepair, ResultSuccess) > 0, nil
	})
	if rules := iptablesSave(t, otherNs.bind); strings.Contains(rules, "ISTIO_") {
		t.Fatalf("the namespace of the pod that now holds %s got the broken pod's capture:\n%s", reused, rules)
	}
	if got := m.PodsRepaired(ActionRepair, ResultSuccess); got != 0 {
		t.Errorf("repair/success = %d, want 0", got)
	}
	ev := waitEvent(t, admin, "web", ReasonRepairGaveUp)
	if !strings.Contains(ev, "is another pod's") || !strings.Contains(ev, "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d") {
		t.Errorf("event %q: want it to say the namespace holding the address is another pod's, naming that pod's uid", ev)
	}

	// The status catches up with the pod's new sandbox, its own by its cgroup
	// (systemd driver's names): repaired.
	own := netip.MustParseAddr("10.251.7.11")
	ownNs := newPodNetns(t, dir, "own-pod", own, true, true)
	inPodCgroup(t, ownNs.proc.Process.Pid, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
		strings.ReplaceAll(string(pod.UID), "-", "_")+".slice/cri-containerd-own.scope")
	setValidation(t, admin, pod, own.String(), 126, "")
	waitFor(t, "the pod's own sandbox captured", 20*time.Second, func() (bool, error) {
		return strings.Contains(iptablesSave(t, ownNs.bind), ":ISTIO_OUTPUT"), nil
	})

	// A static pod's sandbox is in the static pod's cgroup, which its mirror's
	// annotation names.
	const staticUID = "6d1c0f0e9a8b7c6d5e4f3a2b1c0d9e8f"
	staticAddr := netip.MustParseAddr("10.251.7.12")
	staticNs := newPodNetns(t, dir, "static-pod", staticAddr, true, true)
	inPodCgroup(t, staticNs.proc.Process.Pid, "kubepods/burstable/pod"+staticUID+"/sandbox-static")
	mirror := createPod(t, admin, injectedPod("static-"+cfg.NodeName, cfg.NodeName, func(p *corev1.Pod) {
		p.Annotations[kube.MirrorAnnotation] = staticUID
	}))
	setValidation(t, admin, mirror, staticAddr.String(), 126, "")
	waitFor(t, "the static pod's sandbox captured", 20*time.Second, func() (bool, error) {
		return strings.Contains(iptablesSave(t, staticNs.bind), ":ISTIO_OUTPUT"), nil
	})
	wantCount(t, "repair/success", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 2)
	if rules := iptablesSave(t, otherNs.bind); strings.Contains(rules, "ISTIO_") {
		t.Errorf("the other pod's namespace got a capture:\n%s", rules)
	}
}

// setValidationRuns plays the kubelet reporting the validation container's runs
// by their container IDs: the current state (a run going on when current is "")
// and the last termination (none when last is ""), each failed with 126.
func setValidationRuns(t testing.TB, c kubernetes.Interface, p *corev1.Pod, ip netip.Addr, current, last string, restarts int32) *corev1.Pod {
	t.Helper()
	failed := func(id string) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error", ContainerID: "containerd://" + id,
			StartedAt: metav1.Now(), FinishedAt: metav1.Now()}
	}
	st := corev1.ContainerStatus{Name: DefaultInitContainerName, Image: "proxyv2", RestartCount: restarts}
	if current != "" {
		st.State.Terminated = failed(current)
	} else {
		st.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.Now()}
	}
	if last != "" {
		st.LastTerminationState.Terminated = failed(last)
	}
	p = p.DeepCopy()
	p.Status = corev1.PodStatus{Phase: corev1.PodPending, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}},
		InitContainerStatuses: []corev1.ContainerStatus{st}}
	got, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status of pod %s: %v", p.Name, err)
	}
	return got
}

// TestAValidationThatFailsAgainAfterARepairIsRepairedAgain: after an in-place
// repair the pod keeps looking broken (its last termination) until the kubelet
// runs its validation again, which after a few failures is minutes later (the
// crash loop's back-off). The controller remembered the pod as repaired until its
// validation passed; when the next run failed instead (its sandbox died meanwhile
// and the new one was set up while the plugin was still out of the node's chain,
// or the rules were removed), nothing was tried again for as long as the pod
// lived, and no event said so: the pod stayed in Init:CrashLoopBackOff. The
// controller now remembers the failed run it repaired: a restart of the same
// failure searches nothing again, a new failed run is repaired again.
func TestAValidationThatFailsAgainAfterARepairIsRepairedAgain(t *testing.T) {
	e := startInPlace(t, "node-fails-again", "repair-fails-again", netip.MustParseAddr("10.251.8.10"))
	admin, dir, cfg, m, first, firstNs := e.admin, e.dir, e.cfg, e.m, e.first, e.firstNs

	pod := createPod(t, admin, injectedPod("web", cfg.NodeName))
	pod = setValidationRuns(t, admin, pod, first, "run-1", "", 0)
	wantCount(t, "repair/success in the first sandbox", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 1)
	wantCaptured(t, "first sandbox", firstNs.bind)

	// The kubelet runs the validation again: the same failure, now its last
	// termination. Nothing is searched again.
	seen := m.Detected.Load()
	pod = setValidationRuns(t, admin, pod, first, "", "run-1", 1)
	waitFor(t, "the restart seen", 10*time.Second, func() (bool, error) { return m.Detected.Load() > seen, nil })
	if got := m.NetnsScans.Load(); got != 1 {
		t.Errorf("namespace searched %d times after the validation restarted, want once", got)
	}

	// Before that run ends, the sandbox dies; the kubelet's new one is set up
	// while the plugin is still out of the chain, and its validation fails.
	firstNs.proc.Process.Kill()
	firstNs.proc.Wait()
	firstNs.proc = nil
	if err := testns.Delete(firstNs.bind); err != nil {
		t.Fatal(err)
	}
	firstNs.bind = ""
	second := netip.MustParseAddr("10.251.8.11")
	secondNs := newPodNetns(t, dir, "second-sandbox", second, true, true)
	setValidationRuns(t, admin, pod, second, "run-2", "run-1", 2)

	waitFor(t, "the second sandbox captured", 20*time.Second, func() (bool, error) {
		return strings.Contains(iptablesSave(t, secondNs.bind), ":ISTIO_OUTPUT"), nil
	})
	wantCount(t, "repair/success", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 2)
}

// inPlace is a repair controller that repairs in place, against its own API server,
// and the first sandbox of the pod a test makes: a namespace held by a process,
// its bind mount kept, under dir.
type inPlace struct {
	admin   kubernetes.Interface
	dir     string
	cfg     Config
	m       *Metrics
	first   netip.Addr
	firstNs *podNetns
}

func startInPlace(t *testing.T, node, rulesName string, first netip.Addr) inPlace {
	t.Helper()
	root.Require(t)
	cp := startControlPlane(t)
	e := inPlace{admin: cp.AdminClient(), dir: t.TempDir(), cfg: testConfig(node), first: first}
	e.firstNs = newPodNetns(t, e.dir, "first-sandbox", first, true, true)
	c := runController(t, e.cfg, clientWithRules(t, cp, rulesName, rulesFor(e.cfg)),
		inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))
	e.m = c.Metrics()
	return e
}

// wantCaptured fails the test unless the namespace at bind holds the capture.
func wantCaptured(t *testing.T, what, bind string) {
	t.Helper()
	if rules := iptablesSave(t, bind); !strings.Contains(rules, ":ISTIO_OUTPUT") {
		t.Fatalf("%s not captured:\n%s", what, rules)
	}
}
