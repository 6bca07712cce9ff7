package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// newNodeAs makes a node whose agent runs as the ServiceAccount istio-system/istio-cni
// of cp, granted rules: its token and ca.crt are where the kubelet would project
// them. apiEnv are the variables Kubernetes gives the agent's pod for the API server.
func newNodeAs(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, rules []rbacv1.PolicyRule) (n *node, apiEnv []string) {
	t.Helper()
	saKubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "istio-system", "istio-cni", rules)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kube.LoadKubeconfig(saKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	n = newNode(t)
	n.rotateToken(t, sa.Token)
	writeFile(t, filepath.Join(n.saDir, "ca.crt"), cp.CAData(), 0o644)
	return n, []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}
}

func TestKubeconfigFromARealServiceAccountLetsThePluginGetPodsAndNamespacesAndNothingElse(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// The agent's ServiceAccount, with the chart's RBAC for the plugin: get pods, and
	// namespaces (for a pod without a sidecar, its namespace's ambient label decides).
	n, apiEnv := newNodeAs(t, ctx, cp, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get"}},
	})

	p := n.startAgent(t, append(apiEnv,
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system")...)
	p.waitReady(t)

	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps"},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		},
	}
	if _, err := cp.AdminClient().CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The runtime runs the installed plugin with the installed config; the plugin
	// reads the agent's kubeconfig and looks the pod up.
	conf, err := libcni.ConfFromFile(filepath.Join(n.confDir, DefaultStandaloneName))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{
		ContainerID: "feedfacecafe0001", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}},
	}
	if _, err := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, t.TempDir(), nil).AddNetwork(ctx, conf, rt); err != nil {
		t.Fatalf("ADD with the agent's kubeconfig: %v", err)
	}
	eventually(t, 10*time.Second, "the plugin's decision on the fetched pod reaches the agent", func() bool {
		return strings.Contains(p.stdout.String(), `"pod":"apps/web"`) &&
			strings.Contains(p.stdout.String(), `"msg":"ADD: pod passed through"`)
	})
	t.Logf("agent stdout:\n%s", p.stdout.String())
	if v := p.metric(t, `istio_cni_plugin_events_total{command="ADD",outcome="passed_through"}`); v != 1 {
		t.Errorf("ADD passed_through = %v, want 1", v)
	}

	// And nothing else: the same kubeconfig, as the plugin's client reads it.
	kc, err := kube.LoadKubeconfig(filepath.Join(n.runDir, "istio-cni-kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClient(kc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := c.Get(ctx, kube.PodPath("apps", "web"), &obj); err != nil {
		t.Errorf("get pod: %v", err)
	}
	for _, path := range []string{
		"/api/v1/namespaces/apps/pods",        // list pods
		"/api/v1/pods",                        // list pods everywhere
		"/api/v1/namespaces",                  // list namespaces
		"/api/v1/namespaces/apps/secrets/any", // get a secret
		"/api/v1/nodes/node-1",                // get a node
		"/api/v1/namespaces/istio-system/serviceaccounts/istio-cni",
	} {
		err := c.Get(ctx, path, &obj)
		var st *kube.StatusError
		if !errors.As(err, &st) || st.Code != 403 {
			t.Errorf("GET %s with the plugin's kubeconfig: %v, want 403 Forbidden", path, err)
		}
	}
}

// The chart's grants for the default features with labelling on: the plugin's get,
// the pod cache's and the repair controller's list and watch (of namespaces too, for
// their ambient label), the label through pods/status, and events.
var chartRepairRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

// appPod is a plain pod of namespace apps on node, without a sidecar.
func appPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
}

// meshPod is a pod as Istio's injector shapes it with the CNI on: the validation
// init container and the istio-proxy sidecar.
func meshPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "apps",
			Annotations: map[string]string{"sidecar.istio.io/status": `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`},
		},
		Spec: corev1.PodSpec{
			NodeName:       node,
			InitContainers: []corev1.Container{{Name: "istio-validation", Image: "proxyv2", Args: []string{"istio-iptables", "--run-validation", "--skip-rule-apply"}}},
			Containers: []corev1.Container{
				{Name: "app", Image: "app"},
				{Name: "istio-proxy", Image: "proxyv2", Args: []string{"proxy", "sidecar"}},
			},
		},
	}
}

// failValidation plays the kubelet: the pod got ip, and its validation init
// container exited 126, what istio-iptables --run-validation exits with when the
// traffic is not redirected.
func failValidation(t *testing.T, cp *controlplane.ControlPlane, p *corev1.Pod, ip string) {
	t.Helper()
	p = p.DeepCopy()
	p.Status = corev1.PodStatus{
		Phase: corev1.PodPending, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: "istio-validation", Image: "proxyv2",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 126, Reason: "Error", StartedAt: metav1.Now(), FinishedAt: metav1.Now(),
			}},
		}},
	}
	if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set the status of pod %s: %v", p.Name, err)
	}
}

// TestAgentServesItsNodesPodsAndRepairsBrokenPodsAgainstARealAPIServer runs the agent
// as the chart does (NODE_NAME, POD_NAME, the pod cache and repair on, the chart's
// RBAC) against a real kube-apiserver:
//   - pods.sock answers for pods on the agent's node, also ones created later, and
//     not for another node's; the agent keeps a file of each (root's alone), the
//     plugin's own lookup reads its pod there and its namespace from the socket;
//     a deleted pod's file goes;
//   - a broken pod whose address is in a network namespace on the node is repaired
//     in place (the plugin's rules are in that namespace); one whose namespace
//     cannot be found is labelled once the attempts run out;
//   - /metrics shows the cache as synced and the repair counters;
//   - both read the node's pods from one informer: the API server received exactly
//     one watch of pods from the agent, of this node's (spec.nodeName=node-a);
//   - on SIGTERM the socket and the pod files are gone.
func TestAgentServesItsNodesPodsAndRepairsBrokenPodsAgainstARealAPIServer(t *testing.T) {
	auditArgs, podReads := auditPodReads(t, "system:serviceaccount:istio-system:istio-cni")
	cp := controlplane.StartForTest(t, controlplane.Options{ExtraAPIServerArgs: auditArgs})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	n, apiEnv := newNodeAs(t, ctx, cp, chartRepairRules)

	// A pod sandbox on the node: a network namespace holding the broken pod's
	// address, bind-mounted where the runtime would put it.
	netnsDir := t.TempDir()
	sandbox, err := testns.New(netnsDir, "cni-0f1e2d3c")
	if err != nil {
		t.Fatalf("create a pod network namespace (needs root): %v", err)
	}
	t.Cleanup(func() { testns.Delete(sandbox) })
	const fixableIP, lostIP = "198.51.100.21", "198.51.100.22"
	if err := netns.Do(sandbox, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP(fixableIP))})
	}); err != nil {
		t.Fatal(err)
	}

	p := n.startAgent(t, append(apiEnv,
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system", "POD_NAME=istio-cni-node-test", "NODE_NAME=node-a",
		"PLUGIN_LOG_LEVEL=debug",
		"POD_CACHE_ENABLED=true", "REPAIR_ENABLED=true", "REPAIR_REPAIR_PODS=true", "REPAIR_LABEL_PODS=true",
		"REPAIR_PROC_DIR="+t.TempDir(), "REPAIR_NETNS_DIRS="+netnsDir, // only the sandbox above, not this machine's processes
		"REPAIR_MAX_RETRIES=2", "REPAIR_RETRY_BASE_DELAY=50ms", "REPAIR_RETRY_MAX_DELAY=200ms")...)
	p.waitReady(t)

	// The pod cache.
	pods := admin.CoreV1().Pods("apps")
	mine, err := pods.Create(ctx, appPod("web", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, appPod("elsewhere", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the pod cache is synced", func() bool { return p.metric(t, "istio_cni_pod_cache_synced") == 1 })
	sock := filepath.Join(n.runDir, "pods.sock")
	agentClient := kube.NewAgentClient(sock, time.Second)
	var got *kube.Pod
	eventually(t, 10*time.Second, "pods.sock answers for apps/web", func() bool {
		got, err = agentClient.GetPod(ctx, "apps", "web", "", 0)
		return err == nil
	})
	if got.Metadata.UID != string(mine.UID) || got.Spec.NodeName != "node-a" {
		t.Errorf("pods.sock answered apps/web with uid %q node %q, want %q on node-a", got.Metadata.UID, got.Spec.NodeName, mine.UID)
	}
	if _, err := agentClient.GetPod(ctx, "apps", "elsewhere", "", 0); !errors.Is(err, kube.ErrNotFound) {
		t.Errorf("pods.sock for a pod on node-b: %v, want not found", err)
	}
	eventually(t, 10*time.Second, "pods.sock answers for namespace apps", func() bool {
		_, err := agentClient.GetNamespace(ctx, "apps")
		return err == nil
	})
	// The files are read once the agent keeps them (every pod listed written: a
	// few milliseconds after its socket serves).
	filesDir := filepath.Join(n.runDir, kube.AgentPodFilesDir)
	eventually(t, 10*time.Second, "the agent keeps a file of apps/web", func() bool {
		_, err := kube.ReadAgentPodFile(filesDir, "apps", "web")
		return err == nil
	})

	// The plugin asks the cache first.
	conf, err := libcni.ConfFromFile(filepath.Join(n.confDir, DefaultStandaloneName))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{
		ContainerID: "feedfacecafe0002", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_UID", string(mine.UID)}},
	}
	if _, err := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, t.TempDir(), nil).AddNetwork(ctx, conf, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	eventually(t, 10*time.Second, "the plugin reports the pod came from the agent's files and its namespace from its cache", func() bool {
		return strings.Contains(p.stdout.String(), "pod found in the agent's files") &&
			strings.Contains(p.stdout.String(), "namespace found in the agent's cache")
	})

	// The pod files: this node's pods only, root's alone, the JSON the socket
	// answers; a deleted pod's file goes.
	webFile, _ := kube.AgentPodFile(filesDir, "apps", "web")
	for path, want := range map[string]os.FileMode{filesDir: 0o700, webFile: 0o600} {
		if st, err := os.Stat(path); err != nil {
			t.Error(err)
		} else if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
	if f, err := kube.ReadAgentPodFile(filesDir, "apps", "web"); err != nil || f.Metadata.UID != string(mine.UID) {
		t.Errorf("pod file of apps/web: %+v, %v, want uid %s", f, err, mine.UID)
	}
	if _, err := kube.ReadAgentPodFile(filesDir, "apps", "elsewhere"); !errors.Is(err, kube.ErrNotFound) {
		t.Errorf("pod file of a pod on node-b: %v, want none", err)
	}
	short, err := pods.Create(ctx, appPod("short-lived", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a file for the new pod", func() bool {
		_, err := kube.ReadAgentPodFile(filesDir, "apps", short.Name)
		return err == nil
	})
	if err := pods.Delete(ctx, short.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the deleted pod's file removed", func() bool {
		_, err := kube.ReadAgentPodFile(filesDir, "apps", short.Name)
		return errors.Is(err, kube.ErrNotFound)
	})

	// Repair: one pod repaired in place, one labelled after its attempts ran out.
	fixable, err := pods.Create(ctx, meshPod("fixable", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := pods.Create(ctx, meshPod("lost", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failValidation(t, cp, fixable, fixableIP)
	failValidation(t, cp, lost, lostIP)

	series := func(typ, result string) string {
		return `istio_cni_repair_pods_repaired_total{result="` + result + `",type="` + typ + `"}`
	}
	eventually(t, 20*time.Second, "the repair counters show one repair and one label", func() bool {
		return p.metric(t, series("repair", "success")) == 1 && p.metric(t, series("label", "success")) == 1
	})
	var rules []byte
	if err := netns.Do(sandbox, func() error {
		rules, err = exec.Command("iptables-save").CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("iptables-save in the sandbox: %v: %s", err, rules)
	}
	for _, chain := range []string{":ISTIO_INBOUND", ":ISTIO_OUTPUT", ":ISTIO_REDIRECT"} {
		if !strings.Contains(string(rules), chain) {
			t.Errorf("the repaired pod's namespace lacks %s:\n%s", chain, rules)
		}
	}
	lostNow, err := pods.Get(ctx, "lost", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := lostNow.Labels["cni.istio.io/uninitialized"]; v != "true" {
		t.Errorf("pod lost: label cni.istio.io/uninitialized=%q, want true", v)
	}
	fixableNow, err := pods.Get(ctx, "fixable", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fixableNow.Labels["cni.istio.io/uninitialized"]; ok {
		t.Error("pod fixable was repaired in place but labelled too")
	}
	if v := p.metric(t, series("repair", "fail")); v < 2 {
		t.Errorf("repair/fail = %v, want at least the 2 attempts on pod lost", v)
	}
	eventually(t, 10*time.Second, "the repair events reach the API server", func() bool {
		evs, err := admin.CoreV1().Events("apps").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		var repaired, labelled bool
		for _, e := range evs.Items {
			repaired = repaired || (e.InvolvedObject.Name == "fixable" && e.Reason == "RepairBrokenPod" && e.Type == "Normal" &&
				e.Source.Component == "istio-cni-repair" && e.Source.Host == "node-a")
			labelled = labelled || (e.InvolvedObject.Name == "lost" && e.Reason == "LabelBrokenPod")
		}
		return repaired && labelled
	})
	if v := p.metric(t, "istio_cni_install_ready"); v != 1 {
		t.Errorf("istio_cni_install_ready = %v, want 1", v)
	}
	// The chart's dashboard asks only for series this agent (repair on) exports.
	checkDashboard(t, p.scrape(t))
	// One watch of the node's pods for the pod cache and repair together (a list
	// before it, unless client-go streams the first list in the watch), and nothing
	// beyond the node.
	reads := podReads()
	t.Logf("pod lists and watches the API server received from the agent: %v", reads)
	const nodeA = "spec.nodeName=node-a"
	if n := reads["watch "+nodeA]; n != 1 {
		t.Errorf("the agent opened %d watches of its node's pods, want 1 (one informer shared by the pod cache and repair)", n)
	}
	for k, n := range reads {
		if k != "watch "+nodeA && k != "list "+nodeA && k != "relist "+nodeA {
			t.Errorf("the agent sent %d× %q, want only lists and watches of its node's pods", n, k)
		}
	}
	if n := reads["list "+nodeA]; n > 1 {
		t.Errorf("the agent listed its node's pods %d times, want at most 1", n)
	}
	if rss, err := statusField(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid), "VmRSS"); err == nil {
		t.Logf("agent with the pod cache and repair running: RSS %.0f KiB", rss) // a figure for the README, not asserted
	}

	p.stop(t)
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pods.sock left behind after SIGTERM: %v", err)
	}
	if _, err := os.Stat(filesDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod files left behind after SIGTERM: %v", err)
	}
}

// TestAgentKeepsTheNodeReadinessTaintWhileItHoldsTheLease runs the agent with
// TAINT_ENABLED against a real kube-apiserver, with the taint controller's exact
// grants and no pod cache or repair: it takes the Lease as POD_NAME, taints the node
// the agent's DaemonSet runs on whose agent pod is missing and leaves alone the one
// whose agent pod is Ready, shows
// it on /metrics, and releases the Lease on SIGTERM so another agent takes over at once.
func TestAgentKeepsTheNodeReadinessTaintWhileItHoldsTheLease(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin := cp.AdminClient()
	n, apiEnv := newNodeAs(t, ctx, cp, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	})
	agentLabels := map[string]string{"k8s-app": "istio-cni-node"}
	if _, err := admin.AppsV1().DaemonSets("istio-system").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node", Namespace: "istio-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: agentLabels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: agentLabels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node-bare", "node-ready"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentPod, err := admin.CoreV1().Pods("istio-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node-ready", Namespace: "istio-system", Labels: map[string]string{"k8s-app": "istio-cni-node"}},
		Spec:       corev1.PodSpec{NodeName: "node-ready", Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentPod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := admin.CoreV1().Pods("istio-system").UpdateStatus(ctx, agentPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	p := n.startAgent(t, append(apiEnv,
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system", "POD_NAME=istio-cni-node-test",
		"TAINT_ENABLED=true", "TAINT_LEASE_DURATION=2s", "TAINT_RENEW_DEADLINE=1500ms", "TAINT_RETRY_PERIOD=200ms")...)
	p.waitReady(t)

	tainted := func(node string) bool {
		nd, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range nd.Spec.Taints {
			if tn.Key == "cni.istio.io/not-ready" && tn.Effect == corev1.TaintEffectNoSchedule {
				return true
			}
		}
		return false
	}
	eventually(t, 20*time.Second, "node-bare (no agent pod) is tainted", func() bool { return tainted("node-bare") })
	if tainted("node-ready") {
		t.Error("node-ready is tainted although its agent pod is Ready")
	}
	if v := p.metric(t, "istio_cni_taint_leader"); v != 1 {
		t.Errorf("istio_cni_taint_leader = %v, want 1", v)
	}
	if v := p.metric(t, "istio_cni_taint_added_total"); v != 1 {
		t.Errorf("istio_cni_taint_added_total = %v, want 1", v)
	}
	lease, err := admin.CoordinationV1().Leases("istio-system").Get(ctx, "istio-cni-taint", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "istio-cni-node-test" {
		t.Fatalf("lease istio-system/istio-cni-taint: %+v (%v), want held by the agent's POD_NAME", lease, err)
	}

	p.stop(t)
	lease, err = admin.CoordinationV1().Leases("istio-system").Get(ctx, "istio-cni-taint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("lease still held by %q after SIGTERM, want it released", *h)
	}
}

// TestAFeatureThatStoppedIsStartedAgain: the pod cache cannot take its socket at
// start (a directory, not empty, is in its place: what a hostPath mix-up or a stuck
// unmount leaves). It used to stop for good with one log line while the agent stayed
// ready, every ADD then asking the API server. Now it is started again, 1 s later,
// doubling, and serves once the path is free; each restart is counted.
func TestAFeatureThatStoppedIsStartedAgain(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	n, apiEnv := newNodeAs(t, ctx, cp, chartRepairRules)
	sock := filepath.Join(n.runDir, "pods.sock")
	if err := os.MkdirAll(filepath.Join(sock, "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := n.startAgent(t, append(apiEnv,
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system", "NODE_NAME=node-a", "POD_CACHE_ENABLED=true")...)
	p.waitReady(t)
	p.waitLog(t, "the pod cache's failure is logged", `pod cache stopped.*retryIn`)
	// Its informer lists the node's pods whatever the socket: what is served is not.
	if v := p.metric(t, "istio_cni_pod_cache_synced"); v != 0 {
		t.Errorf("istio_cni_pod_cache_synced = %v while the cache has no socket, want 0", v)
	}
	if err := os.RemoveAll(sock); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Pods("apps").Create(ctx, appPod("web", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agentClient := kube.NewAgentClient(sock, time.Second)
	eventually(t, 40*time.Second, "pods.sock answers for apps/web", func() bool {
		_, err := agentClient.GetPod(ctx, "apps", "web", "", 0)
		return err == nil
	})
	if got := p.metric(t, `istio_cni_agent_feature_restarts_total{feature="pod cache"}`); got < 1 {
		t.Errorf("istio_cni_agent_feature_restarts_total for the pod cache = %v, want at least 1", got)
	}
	if v := p.metric(t, "istio_cni_pod_cache_synced"); v != 1 {
		t.Errorf("istio_cni_pod_cache_synced = %v once the socket answers, want 1", v)
	}
	// Each run that stopped left its "synced" wait behind, and every one of them
	// said so once the socket served: as many lines as runs. One is right.
	p.waitLog(t, "the cache says it serves", `pod cache synced`)
	time.Sleep(300 * time.Millisecond) // WaitForCacheSync polls every 100 ms
	for _, line := range []string{"pod cache synced", "pod cache: namespaces synced"} {
		if n := strings.Count(p.stderr.String(), line); n != 1 {
			t.Errorf("%q logged %d times, want once (the run that serves)", line, n)
		}
	}

	// On SIGTERM the features stop before the uninstall begins (the harness's
	// agent uninstalls on exit).
	p.stop(t)
	log := p.stderr.String()
	stopped, uninstalling := strings.Index(log, `msg="API server features stopped"`), strings.Index(log, `msg=uninstalling`)
	if stopped < 0 || uninstalling < 0 || stopped > uninstalling {
		t.Errorf("features stopped at %d, uninstall at %d in the log: want the features stopped first", stopped, uninstalling)
	}
}
