package repair

import (
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
)

func itoa(i int) string { return strconv.Itoa(i) }

func inPlaceDeps(t testing.TB, finder NetnsFinder) Deps {
	t.Helper()
	pcfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","exclude_namespaces":["kube-system"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := iptables.NewBackend(iptables.Config{LockDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return Deps{InPlace: &InPlace{Plugin: pcfg, Backend: b, Finder: finder}}
}

func iptablesSave(t testing.TB, ns string) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, func() error {
		var err error
		out, err = exec.Command("iptables-save").CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("iptables-save in %s: %v: %s", ns, err, out)
	}
	return string(out)
}

// TestBrokenPodIsRepairedInPlaceWithThePluginsRules runs the whole in-place path
// for real: a pod sandbox (a process in its own network namespace holding the
// pod's address, the namespace not bind-mounted anywhere the finder is told
// about), a pod object whose validation failed, and the controller that finds the
// namespace through /proc and programs it with the plugin's own path.
func TestBrokenPodIsRepairedInPlaceWithThePluginsRules(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	ip := netip.MustParseAddr("10.251.2.10")
	dir := t.TempDir()
	pn := newPodNetns(t, dir, "sandbox", ip, true, true)
	if out := iptablesSave(t, pn.bind); strings.Contains(out, "ISTIO_") {
		t.Fatalf("namespace already captured:\n%s", out)
	}

	cfg := testConfig("node-inplace")
	c := runController(t, cfg, clientWithRules(t, cp, "repair-inplace", rulesFor(cfg)),
		inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))

	// Labelled earlier (say by a controller in label mode): the repair removes it.
	pod := createPod(t, admin, injectedPod("web", cfg.NodeName, withLabel(DefaultLabelKey, DefaultLabelValue)))
	pod = setValidation(t, admin, pod, ip.String(), 126, "")

	ev := waitEvent(t, admin, "web", ReasonRepairBrokenPod)
	if !strings.HasPrefix(ev, "Normal ") || !strings.Contains(ev, "/proc/"+itoa(pn.proc.Process.Pid)+"/ns/net") {
		t.Errorf("event %q: want a Normal event naming the namespace found through the sandbox process", ev)
	}
	rules := iptablesSave(t, pn.bind)
	for _, want := range []string{":ISTIO_INBOUND", ":ISTIO_OUTPUT", ":ISTIO_REDIRECT", ":ISTIO_IN_REDIRECT",
		"-A OUTPUT -j ISTIO_OUTPUT", "-A PREROUTING -p tcp -j ISTIO_INBOUND", "--uid-owner 1337"} {
		if !strings.Contains(rules, want) {
			t.Errorf("iptables-save in the pod's namespace lacks %q:\n%s", want, rules)
		}
	}
	// Real traffic: the app's outbound connection now lands on the proxy's
	// outbound port with its original destination.
	// A veth pair with both ends inside: an interface to route through (traffic to
	// lo is never captured).
	err := netns.Do(pn.bind, sandbox.LoopedDefaultRoute)
	if err != nil {
		t.Fatalf("default route in the pod namespace: %v", err)
	}
	proxy, err := sandbox.Serve(pn.bind, 1337, "outbound", "tcp", "0.0.0.0:15001", false)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	if got := sandbox.ProbeFrom(pn.bind, "tcp", netip.MustParseAddrPort("203.0.113.7:80")); got != "outbound 203.0.113.7:80" {
		t.Errorf("app connection to 203.0.113.7:80 answered %q, want the proxy's outbound listener with the original destination", got)
	}

	waitFor(t, "broken label removed", 10*time.Second, func() (bool, error) {
		p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "web", metav1.GetOptions{})
		_, labelled := p.Labels[DefaultLabelKey]
		return err == nil && !labelled, err
	})
	m := c.Metrics()
	wantCount(t, "repair/success", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSuccess) }, 1)

	// The kubelet restarts the validation container: the pod changes while it still
	// looks broken (its last termination). It is not searched for again.
	seen := m.Detected.Load()
	pod, _ = admin.CoreV1().Pods(testNS).Get(t.Context(), "web", metav1.GetOptions{})
	pod.Status.InitContainerStatuses[0].LastTerminationState = pod.Status.InitContainerStatuses[0].State
	pod.Status.InitContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	pod.Status.InitContainerStatuses[0].RestartCount = 1
	if _, err := admin.CoreV1().Pods(testNS).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart seen", 10*time.Second, func() (bool, error) { return m.Detected.Load() > seen, nil })
	if got := m.NetnsScans.Load(); got != 1 {
		t.Errorf("namespace searched %d times, want once", got)
	}
}

// TestInPlaceRepairFallsBackToDeleteWhenItCannotHelp: a pod whose validation never
// runs again (restartPolicy Never) is deleted at once, and a pod whose namespace
// cannot be found is deleted after the bounded retries.
func TestInPlaceRepairFallsBackToDeleteWhenItCannotHelp(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-fallback")
	cfg.DeletePods = true
	cfg.MaxRetries = 3
	c := runController(t, cfg, clientWithRules(t, cp, "repair-fallback", rulesFor(cfg)),
		inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))

	never := createPod(t, admin, injectedPod("once", cfg.NodeName, withRestartPolicy(corev1.RestartPolicyNever)))
	setValidation(t, admin, never, "10.251.3.1", 126, "")
	waitFor(t, "restartPolicy Never pod deleted", 20*time.Second, podDeleted(admin, "once"))
	if ev := waitEvent(t, admin, "once", ReasonRepairBrokenPod); !strings.Contains(ev, "restartPolicy is Never") {
		t.Errorf("event %q does not say why it was not repaired in place", ev)
	}

	lost := createPod(t, admin, injectedPod("lost", cfg.NodeName))
	start := time.Now()
	setValidation(t, admin, lost, "10.251.254.1", 126, "") // no namespace holds it
	waitFor(t, "pod with no namespace deleted", 30*time.Second, podDeleted(admin, "lost"))
	took := time.Since(start)
	m := c.Metrics()
	wantCount(t, "delete/success", func() uint64 { return m.PodsRepaired(ActionDelete, ResultSuccess) }, 2)
	if got := m.PodsRepaired(ActionRepair, ResultFail); got != 3 {
		t.Errorf("repair/fail = %d, want 3 (MaxRetries attempts)", got)
	}
	if got := m.Retries.Load(); got != 2 {
		t.Errorf("retries = %d, want 2", got)
	}
	// Back-off 20ms then 40ms: at least 60ms between the first and the last attempt.
	if took < 60*time.Millisecond {
		t.Errorf("three attempts took %s: no back-off", took)
	}
	t.Logf("3 attempts and the fallback delete took %s", took)
}

// TestAnInPlaceRepairThatCannotHelpIsCountedAsSkipped: every broken pod that an
// in-place repair cannot help is counted in
// istio_cni_repair_pods_repaired_total{type="repair",result="skip"}, whatever the
// reason: a pod whose validation never runs again (restartPolicy Never) as much
// as one whose capture cannot be built or that the plugin would not capture. With
// no fallback action configured nothing else counts it.
func TestAnInPlaceRepairThatCannotHelpIsCountedAsSkipped(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-skip-never")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = true, false, false
	c := runController(t, cfg, clientWithRules(t, cp, "repair-skip-never", rulesFor(cfg)), inPlaceDeps(t, &ProcFinder{ProcDir: "/proc"}))

	never := createPod(t, admin, injectedPod("once", cfg.NodeName, withRestartPolicy(corev1.RestartPolicyNever)))
	setValidation(t, admin, never, "10.251.4.1", 126, "")
	if ev := waitEvent(t, admin, "once", ReasonRepairBrokenPod); !strings.Contains(ev, "restartPolicy is Never") {
		t.Errorf("event %q does not say why it was not repaired in place", ev)
	}
	m := c.Metrics()
	wantCount(t, "repair/skip", func() uint64 { return m.PodsRepaired(ActionRepair, ResultSkip) }, 1)
	if got := m.NetnsScans.Load(); got != 0 {
		t.Errorf("namespace searched %d times for a pod an in-place repair cannot help", got)
	}
}
