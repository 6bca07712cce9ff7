package scale

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/test/harness/root"
)

// waitFor polls cond every 100 ms for at most bound (the test's polling); state,
// if set, says what was seen last.
func waitFor(t testing.TB, bound time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			seen := ""
			if state != nil {
				seen = " (last seen: " + state() + ")"
			}
			t.Fatalf("not true after %s: %s%s", bound, what, seen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkScoped fails t for any pod list or watch of agent a that is not limited to
// a's node by a spec.nodeName field selector, except the taint leader's watch of
// the agent pods in the agents' namespace, by their label. It returns how many
// node-scoped pod lists and watches a made.
func checkScoped(t testing.TB, a *agent, tr traffic) (lists, watches int) {
	t.Helper()
	for c, n := range tr.Calls {
		if c.Resource != "pods" || (c.Verb != "list" && c.Verb != "watch") {
			continue
		}
		switch {
		case c.FieldSelector == "spec.nodeName="+a.node && c.Namespace == "" && c.Verb == "list":
			lists += n
		case c.FieldSelector == "spec.nodeName="+a.node && c.Namespace == "":
			watches += n
		case c.Namespace == agentNamespace && c.LabelSelector == agentLabelKey+"="+agentLabel:
			// The taint leader: one namespace, the agent pods only.
		default:
			t.Errorf("agent of %s: %d× %s: not limited to its node's pods", a.node, n, c)
		}
	}
	return lists, watches
}

// TestAgentsAtScaleWatchOnlyTheirNodeAndAreQuietAtRest runs a small simulated
// cluster (10 nodes of 110 pods, 3 real agents with the chart's pod cache, repair
// and taint election) against a real kube-apiserver, and checks what keeps an
// agent's cost independent of the cluster's size: every pod list and watch an agent
// makes is limited to its own node (so it never lists all pods), the pod cache and
// repair share one watch of the node's pods (one list at most), its pod cache holds
// its node's pods and no other's, pod changes on one node reach that node's agent
// only, and at rest an agent makes no request but the lease election's, at most two
// per retry period. Counts, not timings.
func TestAgentsAtScaleWatchOnlyTheirNodeAndAreQuietAtRest(t *testing.T) {
	root.Require(t)
	size := clusterSize{Pods: 10 * PodsPerNode, PodsPerNamespace: 100}
	sm := newSim(t, size)
	ctx := t.Context()
	sm.startAgents(t, 3)
	waitFor(t, 60*time.Second, "an agent holds the taint lease", func() bool { return sm.leaderIndex(ctx) >= 0 }, nil)

	for i, a := range sm.agents {
		lists, watches := checkScoped(t, a, a.proxy.snapshot())
		if watches != 1 || lists > 1 {
			t.Errorf("agent of %s: %d watches and %d lists of its node's pods, want 1 watch and at most 1 list (one informer for the pod cache and repair)",
				a.node, watches, lists)
		}
		// The first pod of node i is i*110; a pod of the next node is not served.
		own, other := workloadPod(size, i*PodsPerNode, 0), workloadPod(size, ((i+1)%size.nodes())*PodsPerNode, 0)
		if code, err := a.getFromCache(ctx, own.Namespace, own.Name); err != nil || code != http.StatusOK {
			t.Errorf("agent of %s: pod cache answers %d (%v) for its own pod %s, want 200", a.node, code, err, own.Name)
		}
		if code, err := a.getFromCache(ctx, other.Namespace, other.Name); err != nil || code != http.StatusNotFound {
			t.Errorf("agent of %s: pod cache answers %d (%v) for %s on %s, want 404", a.node, code, err, other.Name, other.Spec.NodeName)
		}
	}

	// At rest: nothing but the election (retry period 15 s, the chart's default).
	before, err := sm.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second)
	after, err := sm.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rest := diff("rest", before, after, sm.leaderIndex(ctx))
	const retryPeriod = 15.0 // the chart's taint.retryPeriod (AgentEnv), seconds
	leaseBound := 2*int(rest.secs/retryPeriod) + 4
	for i, a := range sm.agents {
		lease := 0
		for c, n := range rest.agents[i].Calls {
			if c.Resource == "leases" {
				lease += n
				continue
			}
			t.Errorf("agent of %s at rest: %d× %s, want no request but the lease's", a.node, n, c)
		}
		if lease > leaseBound {
			t.Errorf("agent of %s at rest: %d lease requests in %.0f s, want at most %d (two per %.0f s retry period)", a.node, lease, rest.secs, leaseBound, retryPeriod)
		}
		t.Logf("agent of %s at rest for %.1f s: %d lease requests, %d watches open", a.node, rest.secs, lease, rest.agents[i].OpenWatches)
	}

	// Churn on node 0 only: its agent sees every change, the others see none, and
	// the one broken pod is deleted by node 0's repair controller.
	c := loadClient(t, sm.cp)
	before, err = sm.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const replaced = 5
	var broken string
	for slot := range replaced {
		old := workloadPod(size, slot, 0)
		if err := c.CoreV1().Pods(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		p := workloadPod(size, slot, 1)
		if slot == 0 {
			broken = p.Namespace + "/" + p.Name
		}
		if err := createPod(ctx, c, p, podIP(slot), slot == 0); err != nil {
			t.Fatal(err)
		}
	}
	ns, name, _ := strings.Cut(broken, "/")
	// No kubelet confirms the deletion: the deleted pod stays, marked for deletion.
	waitFor(t, 60*time.Second, "node 0's agent deletes the broken pod "+broken, func() bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err != nil || p.DeletionTimestamp != nil
	}, nil)
	// Pod events for node 0 reach its agent within the bound below; others get none.
	var churned window
	waitFor(t, 30*time.Second, "node 0's agent receives the pod events", func() bool {
		after, err := sm.snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		churned = diff("churn", before, after, -1)
		// Per pod: delete, create, status; one informer sees each.
		return churned.agents[0].Events["pods"] >= 3*replaced
	}, func() string {
		return fmt.Sprintf("events %v, bytes %v", churned.agents[0].Events, churned.agents[0].Bytes)
	})
	deletes := 0
	for c, n := range churned.agents[0].Calls {
		if c.Resource == "pods" && c.Verb == "delete" {
			deletes += n
		}
	}
	if deletes != 1 {
		t.Errorf("node 0's agent made %d pod deletes, want 1 (the broken pod)", deletes)
	}
	for i, a := range sm.agents[1:] {
		tr := churned.agents[i+1]
		// The taint leader watches agent pods (in istio-system), not workload pods;
		// none changed, so no agent but node 0's may see a pod event.
		if n := tr.Events["pods"]; n != 0 {
			t.Errorf("agent of %s received %d pod events while only node 0's pods changed, want 0", a.node, n)
		}
		checkScoped(t, a, tr)
	}
	for _, a := range sm.agents {
		if !a.proc.Running() {
			t.Errorf("agent of %s exited: %v", a.node, a.proc.ExitError())
		}
	}
}
