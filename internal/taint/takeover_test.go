package taint

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// An earlier release's taint key, and a key that only looks like it.
const (
	oldKey       = "example.com/old-not-ready"
	oldLookalike = "example.com/old-not-ready-too"
)

// createLease creates the controller's Lease, held by nobody, with the annotation
// KeyAnnotation set to value unless recorded is false: what an earlier leader
// left.
func createLease(t *testing.T, c kubernetes.Interface, recorded bool, value string) {
	t.Helper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: DefaultLeaseName, Namespace: agentNS}}
	if recorded {
		l.Annotations = map[string]string{KeyAnnotation: value}
	}
	if _, err := c.CoordinationV1().Leases(agentNS).Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitRecorded waits for the Lease's KeyAnnotation to be want.
func waitRecorded(t *testing.T, c kubernetes.Interface, want string) {
	t.Helper()
	var got string
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.CoordinationV1().Leases(agentNS).Get(ctx, DefaultLeaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		got = l.Annotations[KeyAnnotation]
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("lease annotation %s = %q, want %q (%v)", KeyAnnotation, got, want, err)
	}
}

func taint(key string, effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: key, Value: "true", Effect: effect}
}

// TestANewTaintKeyLiftsTheEarlierKeysTaints: a helm upgrade changed TAINT_KEY;
// the earlier release's leader left its key on the Lease and its taint on the
// nodes whose agents were restarting. The new leader removes every taint of
// exactly that key (whatever its effect) from the nodes it manages, and no other
// taint: not one whose key only starts like it, not one of a node outside
// TAINT_NODE_LABEL_SELECTOR; it manages its own key meanwhile, and then the Lease
// records its key alone.
func TestANewTaintKeyLiftsTheEarlierKeysTaints(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	mesh := map[string]string{"mesh": "yes"}
	gpu := corev1.Taint{Key: "example.com/gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	// The agent's DaemonSet tolerates the gpu taint; the earlier key's NoSchedule
	// taint keeps it off node-a until the taint is lifted (as a DaemonSet whose
	// tolerations name only the new key would be kept off).
	createNode(t, admin, "node-a", gpu, taint(oldKey, corev1.TaintEffectNoSchedule), taint(oldLookalike, corev1.TaintEffectPreferNoSchedule))
	createNode(t, admin, "node-b", taint(oldKey, corev1.TaintEffectPreferNoSchedule))
	createNode(t, admin, "node-c", taint(oldKey, corev1.TaintEffectNoSchedule)) // not a mesh node
	for _, n := range []string{"node-a", "node-b"} {
		nd, err := admin.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nd.Labels = mesh
		if _, err := admin.CoreV1().Nodes().Update(t.Context(), nd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createDaemonSet(t, admin, "istio-cni-node", mesh)
	createAgent(t, admin, agentNS, "agent-b", "node-b")
	setReady(t, admin, agentNS, "agent-b", true)
	createLease(t, admin, true, oldKey)

	cfg := testConfig("replica-new")
	cfg.NodeSelector = "mesh=yes"
	ctl, _ := start(t, cfg, clientWithRules(t, cp, "taint-new"))

	// node-a has no agent: the new key's taint is added, the earlier one lifted,
	// the others kept. node-b's agent is Ready: the earlier key's taint, of
	// another effect, is lifted too.
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule,"+oldLookalike+"=true:PreferNoSchedule,"+notReady)
	waitTaints(t, admin, "node-b", "")
	waitRecorded(t, admin, DefaultKey)
	if got := taintsOf(t, admin, "node-c"); got != oldKey+"=true:NoSchedule" {
		t.Errorf("node-c (outside %s) taints %q: its taint is not this controller's to lift", EnvNodeSelector, got)
	}

	// The new key is managed: node-a's agent gets Ready.
	createAgent(t, admin, agentNS, "agent-a", "node-a")
	setReady(t, admin, agentNS, "agent-a", true)
	waitTaints(t, admin, "node-a", "example.com/gpu=yes:NoSchedule,"+oldLookalike+"=true:PreferNoSchedule")
	m := ctl.Metrics()
	settle(t, func() bool { return m.TaintsRemoved.Load() >= 3 })
	// The leader's renewals since (each 200 ms here) kept the annotation.
	waitRecorded(t, admin, DefaultKey)
	if m.TaintsAdded.Load() != 1 || m.TaintsRemoved.Load() != 3 {
		t.Errorf("added %d, removed %d; want 1 (node-a) and 3 (the earlier key from node-a and node-b, then node-a's)", m.TaintsAdded.Load(), m.TaintsRemoved.Load())
	}
}

// TestALeaseWithoutARecordedKeyLiftsNothingAndRecordsTheKey: a first install (no
// Lease yet), or an upgrade from a version that recorded no key (a Lease without
// the annotation): no taint is lifted, whatever its key, and the leader records
// its own.
func TestALeaseWithoutARecordedKeyLiftsNothingAndRecordsTheKey(t *testing.T) {
	for _, tc := range []struct {
		name      string
		withLease bool
	}{
		{"no lease", false},
		{"a lease without the annotation", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, admin := readyNodeWithTheEarlierKey(t)
			if tc.withLease {
				createLease(t, admin, false, "")
			}
			ctl, _ := start(t, testConfig("replica-a"), clientWithRules(t, cp, "taint-a"))
			waitRecorded(t, admin, DefaultKey)
			settle(t, ctl.Metrics().Leading.Load)
			time.Sleep(500 * time.Millisecond) // a lift, were there one, is a few milliseconds
			if got := taintsOf(t, admin, "node-a"); got != oldKey+"=true:NoSchedule" {
				t.Errorf("node-a taints %q: nothing recorded the key, nothing is to be lifted", got)
			}
		})
	}
}

// TestARecordedValueThatIsNotATaintKeyIsRefused: a Lease whose annotation holds
// what is not a taint key (edited by hand, or a key and effect) has it refused,
// logged once, and replaced by the controller's key; no taint is removed for it,
// not even one whose key a lenient reading would find in it.
func TestARecordedValueThatIsNotATaintKeyIsRefused(t *testing.T) {
	for _, value := range []string{"not a key!", oldKey + ":NoSchedule", " " + oldKey} {
		t.Run(value, func(t *testing.T) {
			cp, admin := readyNodeWithTheEarlierKey(t)
			createLease(t, admin, true, value)
			var log logbuf.Buffer
			c, err := New(testConfig("replica-a"), clientWithRules(t, cp, "taint-a"), Deps{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			background.Run(t, c.Run)
			waitRecorded(t, admin, DefaultKey)
			time.Sleep(500 * time.Millisecond)
			if got := taintsOf(t, admin, "node-a"); got != oldKey+"=true:NoSchedule" {
				t.Errorf("node-a taints %q: a refused value lifts nothing", got)
			}
			if got := linesOf(log.String(), "level=WARN", "not a taint key: refused"); got != 1 {
				t.Errorf("%d warnings refusing %q, want 1:\n%s", got, value, log.String())
			}
		})
	}
}

// TestALeaderThatLostTheLeaseStopsActingAndTheNextLiftsItsKey: during a rolling
// update that changes TAINT_KEY, the earlier release's leader loses the Lease (its
// renewals fail) while its agent still runs. From then on it taints no node, and
// once the new release's leader holds the Lease, it removes the earlier key's
// taints, which the earlier leader, still running and campaigning, never adds
// again.
func TestALeaderThatLostTheLeaseStopsActingAndTheNextLiftsItsKey(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	createNode(t, admin, "node-a")
	createDaemonSet(t, admin, "istio-cni-node", nil)

	oldCfg := testConfig("replica-old")
	oldCfg.Key = oldKey
	old, _ := start(t, oldCfg, clientWithRules(t, cp, "taint-old"))
	waitTaints(t, admin, "node-a", oldKey+"=true:NoSchedule")
	waitRecorded(t, admin, oldKey)

	// The earlier leader's grant to the Lease goes: its renewals fail and its term
	// ends, while it keeps running.
	var noLease []rbacv1.PolicyRule
	for _, r := range taintRules {
		if r.APIGroups[0] != "coordination.k8s.io" {
			noLease = append(noLease, r)
		}
	}
	if _, err := cp.ServiceAccountKubeconfig(t.Context(), agentNS, "taint-old", noLease); err != nil {
		t.Fatal(err)
	}
	om := old.Metrics()
	settle(t, func() bool { return !om.Leading.Load() })
	if om.Leading.Load() {
		t.Fatal("the earlier leader still leads without its grant to the lease")
	}
	added := om.TaintsAdded.Load()
	createNode(t, admin, "node-b") // no agent: a leader would taint it
	staysUntainted(t, admin, "node-b", "the earlier leader lost the lease")

	_, _ = start(t, testConfig("replica-new"), clientWithRules(t, cp, "taint-new"))
	waitTaints(t, admin, "node-a", notReady)
	waitTaints(t, admin, "node-b", notReady)
	waitRecorded(t, admin, DefaultKey)
	time.Sleep(time.Second)
	waitRecorded(t, admin, DefaultKey) // kept by the renewals since
	for _, n := range []string{"node-a", "node-b"} {
		if got := taintsOf(t, admin, n); got != notReady {
			t.Errorf("node %s taints %q, want %q only", n, got, notReady)
		}
	}
	if got := om.TaintsAdded.Load(); got != added || om.Leading.Load() {
		t.Errorf("the earlier leader, without the lease: leading=%v, added %d taints after losing it", om.Leading.Load(), got-added)
	}
}

// TestANewEffectOfTheSameKeyReplacesTheTaint: a helm upgrade changed TAINT_EFFECT
// alone. The controller owns every effect of its key: a node that needs the taint
// has the earlier effect's replaced by the new one, a node that does not loses it.
// The Lease's record (the key) is unchanged.
func TestANewEffectOfTheSameKeyReplacesTheTaint(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	createNode(t, admin, "node-a", taint(DefaultKey, corev1.TaintEffectNoSchedule))
	createNode(t, admin, "node-b", taint(DefaultKey, corev1.TaintEffectNoSchedule))
	createDaemonSet(t, admin, "istio-cni-node", nil)
	createAgent(t, admin, agentNS, "agent-b", "node-b")
	setReady(t, admin, agentNS, "agent-b", true)
	createLease(t, admin, true, DefaultKey)
	cfg := testConfig("replica-a")
	cfg.Effect = corev1.TaintEffectPreferNoSchedule
	start(t, cfg, clientWithRules(t, cp, "taint-a"))
	waitTaints(t, admin, "node-a", DefaultKey+"=true:PreferNoSchedule")
	waitTaints(t, admin, "node-b", "")
	waitRecorded(t, admin, DefaultKey)
}

// TestANodeWhoseAgentIsNotReadyKeepsATaintWhileTheEarlierKeyIsLifted: nodes
// whose agents are not ready carry the earlier key's taint, which the agent's
// DaemonSet does not tolerate (its tolerations name the new key alone). The new
// leader gives each its own taint before the earlier one goes: every version of
// every node, as a watch sees them, carries one or the other, so no pod can be
// scheduled there meanwhile. Twenty nodes, under the client's rate limit (5
// requests/s), keep the workers busy while the earlier taints are lifted.
func TestANodeWhoseAgentIsNotReadyKeepsATaintWhileTheEarlierKeyIsLifted(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("node-%02d", i))
		createNode(t, admin, names[i], taint(oldKey, corev1.TaintEffectNoSchedule))
	}
	createDaemonSet(t, admin, "istio-cni-node", nil)
	createLease(t, admin, true, oldKey)
	list, err := admin.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := admin.CoreV1().Nodes().Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var bare []string // versions of nodes with neither taint
	seen := make(chan struct{})
	go func() {
		defer close(seen)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == oldKey || t.Key == DefaultKey }) {
				bare = append(bare, n.Name+"@"+n.ResourceVersion)
			}
		}
	}()

	start(t, testConfig("replica-new"), clientWithRules(t, cp, "taint-new"))
	for _, n := range names {
		waitTaints(t, admin, n, notReady)
	}
	waitRecorded(t, admin, DefaultKey)
	w.Stop()
	<-seen
	if len(bare) > 0 {
		t.Errorf("%d node versions carried neither taint while their agents were not ready: %v", len(bare), bare)
	}
}

// readyNodeWithTheEarlierKey starts an API server with node-a, tainted with
// oldKey, whose agent (of the istio-cni-node DaemonSet) is Ready.
func readyNodeWithTheEarlierKey(t *testing.T) (*controlplane.ControlPlane, kubernetes.Interface) {
	t.Helper()
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	createNode(t, admin, "node-a", taint(oldKey, corev1.TaintEffectNoSchedule))
	createDaemonSet(t, admin, "istio-cni-node", nil)
	createAgent(t, admin, agentNS, "agent-a", "node-a")
	setReady(t, admin, agentNS, "agent-a", true)
	return cp, admin
}
