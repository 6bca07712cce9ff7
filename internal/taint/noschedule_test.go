package taint

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestANodeNoAgentIsPlacedOnForANoScheduleTaintIsNotTainted: the DaemonSet
// controller places no agent on a node with a NoSchedule taint the agent's pod
// template does not tolerate (a dedicated pool's, with the chart's tolerations
// replaced), but keeps an agent already there. The taint controller took every
// such node for one an agent would come to, and tainted it for good: even the
// pool's own pods that tolerate its taint but not the readiness taint could no
// longer be scheduled there. Now such a node without an agent is never tainted
// and its taint is removed; one whose agent is still there is tainted until that
// agent is Ready, as any other. The DaemonSet controller's own NoSchedule
// tolerations (a cordoned node) count; a node not ready yet (registering) is one
// the agent comes to once it is; and the readiness taint itself never counts:
// the template here does not tolerate it, and counting it would remove the taint
// the controller has just set, and set it again, in a loop.
func TestANodeNoAgentIsPlacedOnForANoScheduleTaintIsNotTainted(t *testing.T) {
	gpu := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	ours := corev1.Taint{Key: "cni.istio.io/not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	cordoned := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	// The node lifecycle controller's until the kubelet reports the node Ready: the
	// DaemonSet controller places the agent then.
	registering := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	reported := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}
	cases := []struct {
		name        string
		taints      []corev1.Taint
		agent       *corev1.PodCondition // nil: no agent pod on the node
		terminating bool
		want        string // taintsOf the node afterwards
	}{
		{"no agent comes to the pool's node: its taint is removed", []corev1.Taint{gpu, ours}, nil, false, "dedicated=gpu:NoSchedule"},
		{"no agent comes to the pool's node: it is never tainted", []corev1.Taint{gpu}, nil, false, "dedicated=gpu:NoSchedule"},
		{"the agent on the pool's node is being deleted and none comes back", []corev1.Taint{gpu, ours}, &ready, true, "dedicated=gpu:NoSchedule"},
		{"an agent already on the pool's node stays: tainted until it is Ready", []corev1.Taint{gpu}, &reported, false, "dedicated=gpu:NoSchedule," + notReady},
		{"the agent on the pool's node is Ready", []corev1.Taint{gpu, ours}, &ready, false, "dedicated=gpu:NoSchedule"},
		{"a cordoned node still gets an agent", []corev1.Taint{cordoned}, nil, false, notReady},
		{"a registering node keeps the taint it registered with", []corev1.Taint{registering, ours}, nil, false, notReady},
		{"the readiness taint the template does not tolerate stays", []corev1.Taint{ours}, nil, false, notReady},
		{"no taint, no agent yet", nil, nil, false, notReady},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"}, Spec: corev1.NodeSpec{Taints: tc.taints}}
			// The agent's DaemonSet tolerates nothing.
			agent := agentPod(tc.agent)
			if agent != nil && tc.terminating {
				agent.DeletionTimestamp = &metav1.Time{}
			}
			r, client := cachedReconciler(t, node, agent)
			if err := r.reconcile(t.Context(), "node-a"); err != nil {
				t.Fatal(err)
			}
			if got := taintsOf(t, client, "node-a"); got != tc.want {
				t.Errorf("node-a taints %q, want %q", got, tc.want)
			}
			// Once the cache has the result, nothing changes again.
			n, err := client.CoreV1().Nodes().Get(t.Context(), "node-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.nodes.Update(n); err != nil {
				t.Fatal(err)
			}
			before := len(client.Actions())
			if err := r.reconcile(t.Context(), "node-a"); err != nil {
				t.Fatal(err)
			}
			if extra := client.Actions()[before:]; len(extra) != 0 {
				t.Errorf("the node was patched again once the cache had the result: %v", extra)
			}
		})
	}
}
