package taint

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

func createLabelledNode(t *testing.T, c kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	if _, err := c.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// staysUntainted checks, for a while, that node does not get the taint: the
// controller sees every change within milliseconds against a local API server.
func staysUntainted(t *testing.T, c kubernetes.Interface, node, when string) {
	t.Helper()
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := taintsOf(t, c, node); got != "" {
			t.Fatalf("%s: node %s tainted %q", when, node, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTaintFollowsTheAgentsLifecycle, against a real API server (its watch
// semantics matter: a node that stops matching a label-selected watch is reported
// DELETED):
//
//   - a terminating agent pod (a rolling update, an eviction, helm uninstall) never
//     gets its node tainted, nor does the replacement pod while it starts: the
//     plugin stays installed meanwhile;
//   - an agent that stops being ready without being deleted (a crash, a reboot)
//     does;
//   - a tainted node that leaves TAINT_NODE_LABEL_SELECTOR loses the taint;
//   - a node that no DaemonSet of the agent runs on (its node selector excludes it;
//     then the DaemonSet deleted) loses the taint and never gets it again.
func TestTaintFollowsTheAgentsLifecycle(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	mesh := map[string]string{"mesh": "yes"}
	createLabelledNode(t, admin, "node-a", mesh)
	createLabelledNode(t, admin, "node-b", mesh)
	createLabelledNode(t, admin, "node-c", map[string]string{"mesh": "yes", "pool": "gpu"})
	createDaemonSet(t, admin, "istio-cni-node", map[string]string{"mesh": "yes"})
	cfg := testConfig("replica-a")
	cfg.NodeSelector = "mesh=yes"
	ctl, _ := start(t, cfg, clientWithRules(t, cp, "taint-lifecycle"))

	// No agent yet anywhere: every node the DaemonSet runs on is tainted.
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		waitTaints(t, admin, n, notReady)
	}
	createAgent(t, admin, agentNS, "agent-a", "node-a")
	setReady(t, admin, agentNS, "agent-a", true)
	waitTaints(t, admin, "node-a", "")

	// Rolling update: the old agent terminates (a pod bound to a node stays, with its
	// deletionTimestamp, until the kubelet confirms), then goes; the new one starts.
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	staysUntainted(t, admin, "node-a", "old agent terminating")
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-a", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	createAgent(t, admin, agentNS, "agent-a2", "node-a")
	setReady(t, admin, agentNS, "agent-a2", false)
	staysUntainted(t, admin, "node-a", "new agent starting")
	setReady(t, admin, agentNS, "agent-a2", true)

	// The new agent crashes (not ready, not deleted): the taint is right.
	setReady(t, admin, agentNS, "agent-a2", false)
	waitTaints(t, admin, "node-a", notReady)

	// node-b leaves the node selector: the watch reports it DELETED; it is untainted.
	nb, err := admin.CoreV1().Nodes().Get(t.Context(), "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nb.Labels["mesh"] = "no"
	if _, err := admin.CoreV1().Nodes().Update(t.Context(), nb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, admin, "node-b", "")

	// The DaemonSet stops running on node-c (its node selector now excludes gpu nodes
	// by asking for another pool): untainted, as the exiting agent there uninstalls.
	ds, err := admin.AppsV1().DaemonSets(agentNS).Get(t.Context(), "istio-cni-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds.Spec.Template.Spec.NodeSelector["pool"] = "general"
	if _, err := admin.AppsV1().DaemonSets(agentNS).Update(t.Context(), ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, admin, "node-c", "")
	waitTaints(t, admin, "node-a", "") // node-a is not in pool general either

	// helm uninstall: the DaemonSet goes; nothing is tainted again, a new node neither.
	if err := admin.AppsV1().DaemonSets(agentNS).Delete(t.Context(), "istio-cni-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createLabelledNode(t, admin, "node-d", mesh)
	for _, n := range []string{"node-a", "node-c", "node-d"} {
		staysUntainted(t, admin, n, "DaemonSet deleted")
	}
	if !ctl.Metrics().Leading.Load() {
		t.Error("the controller is not leading")
	}
}
