package taint

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

const agentNS = "istio-system"

// The controller's RBAC, exactly as internal/repair/README.md lists it.
var taintRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
}

func testConfig(identity string) Config {
	c := DefaultConfig()
	c.Enabled = true
	c.AgentNamespace = agentNS
	c.Identity = identity
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 200*time.Millisecond
	return c
}

func clientWithRules(t *testing.T, cp *controlplane.ControlPlane, name string) kubernetes.Interface {
	t.Helper()
	return cp.ServiceAccountClientForTest(t, agentNS, name, taintRules)
}

// start runs a controller until the returned stop is called (or the test ends).
func start(t *testing.T, cfg Config, client kubernetes.Interface) (*Controller, func()) {
	t.Helper()
	c, err := New(cfg, client, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return c, background.Run(t, c.Run)
}

func createNode(t *testing.T, c kubernetes.Interface, name string, taints ...corev1.Taint) {
	t.Helper()
	_, err := c.CoreV1().Nodes().Create(t.Context(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// createDaemonSet creates the agent's DaemonSet (no controller manager runs: the
// tests create the pods it would), running on the nodes with nodeSelector. It
// tolerates the GPU pool's taint some tests give a node: one it did not tolerate
// would keep its agents off that node.
func createDaemonSet(t *testing.T, c kubernetes.Interface, name string, nodeSelector map[string]string) {
	t.Helper()
	labels := map[string]string{"k8s-app": "istio-cni-node"}
	_, err := c.AppsV1().DaemonSets(agentNS).Create(t.Context(), &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentNS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: nodeSelector, Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}},
					Tolerations: []corev1.Toleration{{Key: "example.com/gpu", Operator: corev1.TolerationOpExists}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func createAgent(t *testing.T, c kubernetes.Interface, ns, name, node string) *corev1.Pod {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"k8s-app": "istio-cni-node"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setReady plays the kubelet reporting the agent's readiness: a Ready condition
// that is not True has the reason the kubelet gives it.
func setReady(t *testing.T, c kubernetes.Interface, ns, name string, ready bool) {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}
	if ready {
		cond = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond}}
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func taintsOf(t *testing.T, c kubernetes.Interface, node string) string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, tn := range n.Spec.Taints {
		if strings.HasPrefix(tn.Key, "node.kubernetes.io/") {
			continue // the apiserver's TaintNodesByCondition admission adds not-ready to new nodes
		}
		s = append(s, tn.Key+"="+tn.Value+":"+string(tn.Effect))
	}
	return strings.Join(s, ",")
}

func waitTaints(t *testing.T, c kubernetes.Interface, node, want string) {
	t.Helper()
	var got string
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = taintsOf(t, c, node)
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("node %s taints %q, want %q", node, got, want)
	}
}

// settle waits (bounded) for a counter condition; the caller then checks exact values.
func settle(t *testing.T, cond func() bool) {
	t.Helper()
	_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
}

const notReady = "cni.istio.io/not-ready=true:NoSchedule"

func TestTaintFollowsAgentReadinessAndOneLeaderActs(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	for _, ns := range []string{agentNS, "elsewhere"} {
		if err := cp.EnsureNamespace(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	other := corev1.Taint{Key: "example.com/gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	createNode(t, admin, "node-a", other)
	createNode(t, admin, "node-b")
	createDaemonSet(t, admin, "istio-cni-node", nil)

	a, stopA := start(t, testConfig("replica-a"), clientWithRules(t, cp, "taint-a"))
	b, stopB := start(t, testConfig("replica-b"), clientWithRules(t, cp, "taint-b"))

	// No agent yet: both nodes get the taint, and the other taint is kept.
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule,"+notReady)
	waitTaints(t, admin, "node-b", notReady)

	// An agent that is not ready yet changes nothing; a ready one lifts the taint.
	createAgent(t, admin, agentNS, "istio-cni-node-a", "node-a")
	setReady(t, admin, agentNS, "istio-cni-node-a", false)
	// A ready pod with the agent's labels in another namespace is not the agent.
	createAgent(t, admin, "elsewhere", "istio-cni-node-b", "node-b")
	setReady(t, admin, "elsewhere", "istio-cni-node-b", true)
	setReady(t, admin, agentNS, "istio-cni-node-a", true)
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule")
	if got := taintsOf(t, admin, "node-b"); got != notReady {
		t.Errorf("node-b taints %q: the ready pod is not in the agent namespace", got)
	}

	// The agent stops being ready: the taint comes back.
	setReady(t, admin, agentNS, "istio-cni-node-a", false)
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule,"+notReady)

	// One leader did all of it: 2 taints added, 1 removed, 1 added again.
	leader, follower := a, b
	if b.Metrics().Leading.Load() {
		leader, follower = b, a
	}
	lm, fm := leader.Metrics(), follower.Metrics()
	// The node shows a change just before the leader has the answer and counts it.
	settle(t, func() bool { return lm.TaintsAdded.Load() >= 3 && lm.TaintsRemoved.Load() >= 1 })
	if lm.TaintsAdded.Load() != 3 || lm.TaintsRemoved.Load() != 1 {
		t.Errorf("leader added %d, removed %d; want 3 and 1", lm.TaintsAdded.Load(), lm.TaintsRemoved.Load())
	}
	if fm.TaintsAdded.Load()+fm.TaintsRemoved.Load() != 0 || fm.Leading.Load() {
		t.Errorf("follower acted: leading=%v added=%d removed=%d", fm.Leading.Load(), fm.TaintsAdded.Load(), fm.TaintsRemoved.Load())
	}

	// The leader goes away and releases the lease: the other replica takes over.
	if leader == a {
		stopA()
	} else {
		stopB()
	}
	setReady(t, admin, agentNS, "istio-cni-node-a", true)
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule")
	settle(t, func() bool { return fm.TaintsRemoved.Load() >= 1 })
	if fm.TaintsRemoved.Load() != 1 || !fm.Leading.Load() {
		t.Errorf("new leader: leading=%v removed=%d, want true and 1", fm.Leading.Load(), fm.TaintsRemoved.Load())
	}
	if lm.TaintsRemoved.Load() != 1 {
		t.Errorf("old leader removed %d after stopping", lm.TaintsRemoved.Load())
	}
}
