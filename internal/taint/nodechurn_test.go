package taint

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// TestANodeDeletedDuringItsAgentsHandoverIsTaintedWhenItsNameComesBack: under node
// churn (an autoscaler's scale-down drains the node, so its agent pod is seen
// terminating, then the node is deleted) the leader must forget the node's
// handover with the node. Otherwise its memory grows with every node ever removed
// this way for as long as it leads, and a new node that reuses the name (EKS
// names nodes by their private IP, which the VPC hands out again) is taken for a
// node whose agent is being replaced: it is never tainted while its first agent
// starts, and meshed pods scheduled there meanwhile start without redirection.
func TestANodeDeletedDuringItsAgentsHandoverIsTaintedWhenItsNameComesBack(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	const node = "ip-10-0-1-7.ec2.internal"
	createNode(t, admin, node)
	createDaemonSet(t, admin, "istio-cni-node", nil)
	start(t, testConfig("replica-a"), clientWithRules(t, cp, "taint-churn"))
	waitTaints(t, admin, node, notReady)
	createAgent(t, admin, agentNS, "agent-old", node)
	setReady(t, admin, agentNS, "agent-old", true)
	waitTaints(t, admin, node, "")

	// Scale-down: the agent is evicted (terminating), the node deleted, and the
	// pod garbage collector removes the pod of the vanished node.
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	staysUntainted(t, admin, node, "agent terminating")
	if err := admin.CoreV1().Nodes().Delete(t.Context(), node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-old", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the leader sees both deletions

	// Later a new node gets the same name; its first agent is starting.
	createNode(t, admin, node)
	createAgent(t, admin, agentNS, "agent-new", node)
	setReady(t, admin, agentNS, "agent-new", false)
	waitTaints(t, admin, node, notReady)
}

// TestANodeTheAgentLeftForGoodIsTaintedWhenTheAgentComesBack: a node that the
// agent's DaemonSet stops running on (its node selector no longer matches the
// node's labels) sees its agent terminate and, no DaemonSet being left there,
// uninstall the plugin: a removal, not a handover. When the node matches again,
// the agent that starts there is a first install and the node must carry the
// taint until it is Ready; the leader's memory of the old agent's termination
// must not last until then.
func TestANodeTheAgentLeftForGoodIsTaintedWhenTheAgentComesBack(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	const node = "node-a"
	createLabelledNode(t, admin, node, map[string]string{"mesh": "yes"})
	createDaemonSet(t, admin, "istio-cni-node", map[string]string{"mesh": "yes"})
	start(t, testConfig("replica-a"), clientWithRules(t, cp, "taint-churn"))
	waitTaints(t, admin, node, notReady)
	createAgent(t, admin, agentNS, "agent-old", node)
	setReady(t, admin, agentNS, "agent-old", true)
	waitTaints(t, admin, node, "")

	// The node leaves the DaemonSet; its agent terminates and is gone.
	relabel := func(mesh string) {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels["mesh"] = mesh
		if _, err := admin.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("no")
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	staysUntainted(t, admin, node, "agent leaving the node")
	if err := admin.CoreV1().Pods(agentNS).Delete(t.Context(), "agent-old", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	staysUntainted(t, admin, node, "no DaemonSet on the node")

	// The node is back in the DaemonSet; a new agent starts there.
	relabel("yes")
	createAgent(t, admin, agentNS, "agent-new", node)
	setReady(t, admin, agentNS, "agent-new", false)
	waitTaints(t, admin, node, notReady)
}
