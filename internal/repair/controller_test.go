package repair

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/internal/informer"
)

// bystanders are pods the controller must leave alone; each is created on node
// and gets a status, before the broken pod does.
func bystanders(t *testing.T, admin kubernetes.Interface, node, prefix string) []string {
	t.Helper()
	cases := []struct {
		name string
		node string
		opts []podOpt
		code int32
		msg  string
	}{
		{prefix + "-healthy", node, nil, 0, ""},
		{prefix + "-other-node", "some-other-node", nil, 126, ""},
		{prefix + "-not-injected", node, []podOpt{withoutSidecarStatus}, 126, ""},
		{prefix + "-other-code", node, nil, 1, "unrelated failure"},
	}
	var names []string
	for i, c := range cases {
		p := createPod(t, admin, injectedPod(c.name, c.node, c.opts...))
		setValidation(t, admin, p, "10.1.0."+string(rune('1'+i)), c.code, c.msg)
		names = append(names, c.name)
	}
	return names
}

// wantUntouched checks that the bystanders named are still there, not repaired
// (repaired says whether the controller acted on a pod) and without events.
func wantUntouched(t *testing.T, admin kubernetes.Interface, names []string, repaired func(p *corev1.Pod) bool) {
	t.Helper()
	for _, name := range names {
		p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v, but it is not broken", name, err)
			continue
		}
		if repaired(p) {
			t.Errorf("pod %s was repaired, but it is not broken", name)
		}
		if ev := eventsFor(t, admin, name); len(ev) > 0 {
			t.Errorf("pod %s got events %q", name, ev)
		}
	}
}

func TestBrokenPodsAreDeletedOrLabelledBySettingAndOthersAreUntouched(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()

	t.Run("delete", func(t *testing.T) {
		cfg := testConfig("node-delete")
		cfg.RepairPods, cfg.DeletePods = false, true
		c := runController(t, cfg, clientWithRules(t, cp, "repair-delete", rulesFor(cfg)), Deps{})
		others := bystanders(t, admin, cfg.NodeName, "del")
		broken := createPod(t, admin, injectedPod("del-broken", cfg.NodeName))
		setValidation(t, admin, broken, "10.1.0.9", 126, "")

		waitFor(t, "broken pod deleted", 20*time.Second, podDeleted(admin, "del-broken"))
		ev := waitEvent(t, admin, "del-broken", ReasonDeleteBrokenPod)
		if !strings.Contains(ev, "exited with code 126") {
			t.Errorf("event %q does not say why", ev)
		}
		wantUntouched(t, admin, others, func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil })
		wantCount(t, "delete/success", func() uint64 { return c.Metrics().PodsRepaired(ActionDelete, ResultSuccess) }, 1)
	})

	t.Run("label", func(t *testing.T) {
		cfg := testConfig("node-label")
		cfg.RepairPods, cfg.LabelPods = false, true
		cfg.LabelKey, cfg.LabelValue = "example.com/broken", "yes"
		c := runController(t, cfg, clientWithRules(t, cp, "repair-label", rulesFor(cfg)), Deps{})
		others := bystanders(t, admin, cfg.NodeName, "lbl")
		broken := createPod(t, admin, injectedPod("lbl-broken", cfg.NodeName))
		setValidation(t, admin, broken, "10.1.0.9", 126, "")

		waitFor(t, "broken pod labelled", 20*time.Second, func() (bool, error) {
			p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "lbl-broken", metav1.GetOptions{})
			return err == nil && p.Labels["example.com/broken"] == "yes", err
		})
		waitEvent(t, admin, "lbl-broken", ReasonLabelBrokenPod)
		wantUntouched(t, admin, others, func(p *corev1.Pod) bool { _, ok := p.Labels["example.com/broken"]; return ok })
		wantCount(t, "label/success", func() uint64 { return c.Metrics().PodsRepaired(ActionLabel, ResultSuccess) }, 1)
	})

	t.Run("termination message must match when set", func(t *testing.T) {
		cfg := testConfig("node-msg")
		cfg.RepairPods, cfg.LabelPods = false, true
		cfg.InitTerminationMsg, cfg.InitExitCode = "traffic is not redirected", 0
		c := runController(t, cfg, admin, Deps{})
		wrong := createPod(t, admin, injectedPod("msg-wrong", cfg.NodeName))
		setValidation(t, admin, wrong, "10.1.0.10", 126, "something else")
		right := createPod(t, admin, injectedPod("msg-right", cfg.NodeName))
		setValidation(t, admin, right, "10.1.0.11", 7, "  traffic is not redirected\n")
		waitFor(t, "pod with the message labelled", 20*time.Second, func() (bool, error) {
			p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "msg-right", metav1.GetOptions{})
			return err == nil && p.Labels[DefaultLabelKey] == DefaultLabelValue, err
		})
		p, _ := admin.CoreV1().Pods(testNS).Get(t.Context(), "msg-wrong", metav1.GetOptions{})
		if _, ok := p.Labels[DefaultLabelKey]; ok {
			t.Error("pod whose message differs was labelled")
		}
		wantCount(t, "label/success", func() uint64 { return c.Metrics().PodsRepaired(ActionLabel, ResultSuccess) }, 1)
	})
}

// TestStaleEventDoesNotDeleteOrLabelRecreatedPod plays the race the UID
// precondition exists for: the controller acts on its cached copy of a broken pod
// that has meanwhile been deleted and recreated under the same name.
func TestStaleEventDoesNotDeleteOrLabelRecreatedPod(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-stale")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, true, true
	c, err := New(cfg, clientWithRules(t, cp, "repair-stale", rulesFor(cfg)), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	old := setValidation(t, admin, createPod(t, admin, injectedPod("web-0", cfg.NodeName)), "10.1.0.1", 126, "")
	if err := admin.CoreV1().Pods(testNS).Delete(t.Context(), "web-0", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	recreated := createPod(t, admin, injectedPod("web-0", cfg.NodeName))
	if recreated.UID == old.UID {
		t.Fatal("recreated pod has the old uid")
	}

	err = c.deletePod(t.Context(), old, "stale")
	if !apierrors.IsConflict(err) {
		t.Errorf("delete with the old pod: got %v, want a conflict (precondition failed)", err)
	}
	err = c.labelPod(t.Context(), old, "stale")
	if err == nil {
		t.Error("label with the old pod succeeded")
	}
	p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "web-0", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("recreated pod: %v", err)
	}
	if p.UID != recreated.UID {
		t.Errorf("pod uid %s, want the recreated %s", p.UID, recreated.UID)
	}
	if _, ok := p.Labels[DefaultLabelKey]; ok {
		t.Error("recreated pod got the broken label")
	}
	if got := c.Metrics().PodsRepaired(ActionDelete, ResultSuccess); got != 0 {
		t.Errorf("delete/success = %d, want 0", got)
	}

	// A pod that changed since it was judged is not deleted on the old judgement
	// either: the resourceVersion precondition sends it back to be judged again.
	cur := setValidation(t, admin, p, "10.1.0.2", 126, "")
	setValidation(t, admin, cur, "10.1.0.2", 0, "")
	if err := c.deletePod(t.Context(), cur, "stale"); !apierrors.IsConflict(err) {
		t.Errorf("delete of a since-changed pod: got %v, want a conflict", err)
	}
}

func TestSettingsAreValidatedNamingTheVariable(t *testing.T) {
	// New refuses an invalid config before touching the API server.
	cfg := testConfig("")
	_, err := New(cfg, nil, Deps{})
	if err == nil || !strings.Contains(err.Error(), EnvNodeName) {
		t.Errorf("New without a node: %v, want an error naming %s", err, EnvNodeName)
	}
	cfg = testConfig("node-a")
	_, err = New(cfg, &fakeNoClient{}, Deps{})
	if err == nil || !strings.Contains(err.Error(), EnvRepairPods) {
		t.Errorf("New with repair in place but no plugin path: %v, want an error naming %s", err, EnvRepairPods)
	}
}

// fakeNoClient is never called: New fails before using it.
type fakeNoClient struct{ kubernetes.Interface }

// TestControllerSharesTheNodesPodInformerOnlyWhenItSelectsAllOfThem: given the
// agent's informer of the node's pods (run by its owner, here the test, before the
// controller starts), the controller acts through it when it watches exactly that
// node's pods; when REPAIR_LABEL_SELECTORS or REPAIR_FIELD_SELECTORS narrow its
// selection, or it watches another node, it keeps its own informer, and a broken
// pod outside its selection, which the shared informer holds, is left alone.
func TestControllerSharesTheNodesPodInformerOnlyWhenItSelectsAllOfThem(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cases := []struct {
		name       string
		node       string
		sharedNode string // the shared informer's node
		label      string
		field      string
		excluded   bool // a broken pod outside the selection is created first
		wantShared bool
	}{
		{name: "all the node's pods", node: "node-share", sharedNode: "node-share", wantShared: true},
		{name: "label selector", node: "node-sel-label", sharedNode: "node-sel-label", label: "app=web", excluded: true},
		{name: "field selector", node: "node-sel-field", sharedNode: "node-sel-field", field: "metadata.name!=node-sel-field-out", excluded: true},
		{name: "another node", node: "node-mine", sharedNode: "node-theirs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			shared := informer.NewNodePods(admin.CoreV1(), tc.sharedNode)
			go shared.Run(ctx)
			cfg := testConfig(tc.node)
			cfg.RepairPods, cfg.LabelPods = false, true
			cfg.LabelSelector, cfg.FieldSelector = tc.label, tc.field
			c := runController(t, cfg, admin, Deps{NodePods: shared, Workers: 1})
			if got := c.SharesNodePods(); got != tc.wantShared {
				t.Errorf("SharesNodePods() = %v, want %v", got, tc.wantShared)
			}
			// One worker takes pods in the order their changes arrive: a pod outside
			// the selection, were it seen, would be labelled before the one inside.
			if tc.excluded {
				setValidation(t, admin, createPod(t, admin, injectedPod(tc.node+"-out", tc.node)), "10.2.0.1", 126, "")
			}
			setValidation(t, admin, createPod(t, admin, injectedPod(tc.node+"-in", tc.node, withLabel("app", "web"))), "10.2.0.2", 126, "")
			waitFor(t, "broken pod labelled", 20*time.Second, func() (bool, error) {
				p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), tc.node+"-in", metav1.GetOptions{})
				return err == nil && p.Labels[DefaultLabelKey] == DefaultLabelValue, err
			})
			wantCount(t, "label/success", func() uint64 { return c.Metrics().PodsRepaired(ActionLabel, ResultSuccess) }, 1)
			if tc.excluded {
				wantUntouched(t, admin, []string{tc.node + "-out"}, func(p *corev1.Pod) bool { _, ok := p.Labels[DefaultLabelKey]; return ok })
			}
		})
	}
}
