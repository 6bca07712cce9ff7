package taint

import (
	"io"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestAnAgentMarkedNotReadyByTheNodeLifecycleControllerLeavesTheTaintAsItIs: when
// kubelets lose the API server for longer than the node monitor's grace period
// (an outage behind a load balancer while the controller manager and the agents
// reach it through its Service, a node partition, or an API server recovering
// from an outage too loaded by every client's relist to take the kubelets'
// updates in time), kube-controller-manager's node lifecycle controller sets the
// nodes' Ready condition Unknown and turns every Ready pod there not Ready,
// keeping the condition's empty reason (MarkPodsNotReady). The agents did not go
// not ready: nobody knows. The taint is left as it is, not added on every node of
// the cluster, which would stop scheduling on all of them once the kubelets are
// back, until each kubelet reports again and the leader has patched each node
// twice at the client's 5 requests a second. A not-ready agent its kubelet
// reports (always with a reason) still taints its node.
func TestAnAgentMarkedNotReadyByTheNodeLifecycleControllerLeavesTheTaintAsItIs(t *testing.T) {
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	// What MarkPodsNotReady makes of a Ready pod's condition.
	marked := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse}
	// What the kubelet reports of an agent whose readiness probe fails.
	reported := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady",
		Message: "containers with unready status: [install-cni]"}
	ours := corev1.Taint{Key: "cni.istio.io/not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	unreachable := corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}
	cases := []struct {
		name      string
		nodeReady corev1.ConditionStatus
		taints    []corev1.Taint
		agent     *corev1.PodCondition // nil: no agent pod on the node
		wantPatch bool
	}{
		{"the node went silent and its Ready agent was marked not ready", corev1.ConditionUnknown, []corev1.Taint{unreachable}, &marked, false},
		{"the node reports again, its kubelet has not rewritten the agent's mark yet", corev1.ConditionTrue, nil, &marked, false},
		{"a node tainted before it went silent keeps the taint", corev1.ConditionUnknown, []corev1.Taint{unreachable, ours}, &marked, false},
		{"the kubelet reports the agent not ready", corev1.ConditionTrue, nil, &reported, true},
		{"no agent on the node", corev1.ConditionTrue, nil, nil, true},
		{"the agent is ready again", corev1.ConditionTrue, []corev1.Taint{ours}, &ready, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"},
				Spec:       corev1.NodeSpec{Taints: tc.taints},
				Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: tc.nodeReady}}},
			}
			r, client := cachedReconciler(t, node, agentPod(tc.agent))
			if err := r.reconcile(t.Context(), "node-a"); err != nil {
				t.Fatal(err)
			}
			var patches []string
			for _, a := range client.Actions() {
				if a.GetVerb() == "patch" {
					patches = append(patches, a.GetResource().Resource+"/"+a.GetSubresource())
				}
			}
			if got := len(patches) > 0; got != tc.wantPatch {
				t.Errorf("node patched: %v (%v), want %v", got, patches, tc.wantPatch)
			}
		})
	}
}

// cachedReconciler is a reconciler over a fake clientset holding node, with node
// and agent (when not nil) in its caches, as its informers would have them.
func cachedReconciler(t *testing.T, node *corev1.Node, agent *corev1.Pod) (*reconciler, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(node)
	c, err := New(testConfig("a"), client, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := hungReconciler(t, c, false)
	if err := r.nodes.Add(node); err != nil {
		t.Fatal(err)
	}
	if agent != nil {
		if err := r.pods.Add(agent); err != nil {
			t.Fatal(err)
		}
	}
	return r, client
}

// agentPod is a running agent pod on node-a with the Ready condition ready, nil
// for no agent.
func agentPod(ready *corev1.PodCondition) *corev1.Pod {
	if ready == nil {
		return nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node-x", Namespace: agentNS, Labels: map[string]string{"k8s-app": "istio-cni-node"}},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{*ready}},
	}
}
