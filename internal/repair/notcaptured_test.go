package repair

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// TestPodThePluginSkipsIsReportedOnceAndNeverDeleted: a pod whose istio-validation
// fails but that the plugin skips (here sidecar.istio.io/inject=false; an excluded
// namespace or DISABLE_ENVOY alike) can never pass it: deleting it only brings a
// replacement broken the same way. With the delete action, and against a real API
// server with the action's exact grants, it is reported once (one event, one log
// line naming the plugin's reason), never deleted, over several failures of its
// validation. A pod the plugin captures is the race, and is deleted as before. In
// delete-only mode the agent may not label pods, so it is not labelled either.
func TestPodThePluginSkipsIsReportedOnceAndNeverDeleted(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-skip")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, true, false
	client := clientWithRules(t, cp, "repair-skip", rulesFor(cfg))
	pcfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`))
	if err != nil {
		t.Fatal(err)
	}
	var logs logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := New(cfg, client, Deps{Logger: logger, Plugin: pcfg})
	if err != nil {
		t.Fatal(err)
	}
	background.Run(t, c.Run)
	waitFor(t, "controller synced", 30*time.Second, func() (bool, error) { return c.HasSynced(), nil })

	skipped := createPod(t, admin, injectedPod("opted-out", cfg.NodeName, withLabel("sidecar.istio.io/inject", "false")))
	setValidation(t, admin, skipped, "10.1.0.1", 126, "")
	raced := createPod(t, admin, injectedPod("raced", cfg.NodeName))
	setValidation(t, admin, raced, "10.1.0.9", 126, "")
	waitFor(t, "the pod the plugin captures deleted", 20*time.Second, podDeleted(admin, "raced"))

	for pass := 1; pass <= 3; pass++ {
		before := c.Metrics().Detected.Load()
		p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "opted-out", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		p.Status.InitContainerStatuses[0].RestartCount = int32(pass)
		setValidation(t, admin, p, "10.1.0.1", 126, fmt.Sprintf("pass %d", pass))
		waitFor(t, fmt.Sprintf("pass %d judged", pass), 20*time.Second, func() (bool, error) {
			return c.Metrics().Detected.Load() > before, nil
		})
	}

	p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "opted-out", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the pod the plugin skips was deleted (%v): its replacement would fail the same way", err)
	}
	if _, ok := p.Labels[DefaultLabelKey]; ok {
		t.Errorf("labelled %v although labelling is off", p.Labels)
	}
	var reports []string
	for _, e := range eventsFor(t, admin, "opted-out") {
		if strings.Contains(e, " "+ReasonNotCaptured+": ") {
			reports = append(reports, e)
		} else {
			t.Errorf("event %q, want only %s", e, ReasonNotCaptured)
		}
	}
	if len(reports) != 1 {
		t.Fatalf("%d %s events, want 1: %q", len(reports), ReasonNotCaptured, reports)
	}
	for _, w := range []string{"the plugin does not capture this pod", `sidecar.istio.io/inject="false"`, "not deleted"} {
		if !strings.Contains(reports[0], w) {
			t.Errorf("event %q does not say %q", reports[0], w)
		}
	}
	if n := linesWith(&logs, "pod="+testNS+"/opted-out ", "does not capture this pod"); n != 1 {
		t.Errorf("%d log lines report the pod, want 1", n)
	}
	if got := c.Metrics().NotCaptured.Load(); got != 1 {
		t.Errorf("not-captured counter %d, want 1", got)
	}
	if n := c.Metrics().PodsRepaired(ActionDelete, ResultSuccess); n != 1 {
		t.Errorf("%d pods deleted, want 1 (the raced one)", n)
	}
}

// TestPodThePluginSkipsIsNotLabelledWhenDeletingWinsOverLabelling: with the chart's
// defaults, REPAIR_DELETE_PODS and REPAIR_LABEL_PODS both true, deleting wins and
// labelling is never the action, so the chart grants no pods/status patch ("labelPods
// ... Ignored while deletePods is true"). A pod the plugin skips is then reported once
// and left alone, as in delete-only mode: not labelled, which the API server would
// refuse, failing each attempt until the controller gave up on the pod with an event
// saying its traffic is still not redirected, while its report claimed it labelled.
func TestPodThePluginSkipsIsNotLabelledWhenDeletingWinsOverLabelling(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-skip-delete-label")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, true, true
	// The chart's ClusterRole for its defaults: no pods/status.
	client := clientWithRules(t, cp, "repair-skip-delete-label", []rbacv1.PolicyRule{rbacWatchPods, rbacEvents, rbacDeletePod})
	pcfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, client, Deps{Plugin: pcfg})
	if err != nil {
		t.Fatal(err)
	}
	background.Run(t, c.Run)
	waitFor(t, "controller synced", 30*time.Second, func() (bool, error) { return c.HasSynced(), nil })

	skipped := createPod(t, admin, injectedPod("opted-out", cfg.NodeName, withLabel("sidecar.istio.io/inject", "false")))
	setValidation(t, admin, skipped, "10.1.0.1", 126, "")
	waitFor(t, "the pod reported", 20*time.Second, func() (bool, error) { return c.Metrics().NotCaptured.Load() == 1, nil })
	// Five failed attempts take well under a second at the test's back-off.
	time.Sleep(2 * time.Second)

	if r, g, f := c.Metrics().Retries.Load(), c.Metrics().GaveUp.Load(), c.Metrics().PodsRepaired(ActionLabel, ResultFail); r != 0 || g != 0 || f != 0 {
		t.Errorf("%d retries, %d given up, %d failed labels; want none: the pod is to be left alone", r, g, f)
	}
	p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "opted-out", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the pod the plugin skips was deleted (%v)", err)
	}
	for _, e := range eventsFor(t, admin, "opted-out") {
		if !strings.Contains(e, " "+ReasonNotCaptured+": ") {
			t.Errorf("event %q, want only %s", e, ReasonNotCaptured)
		} else if strings.Contains(e, "labelled") {
			t.Errorf("event %q says the pod was labelled, which this agent may not do", e)
		}
	}
}

// TestAReportSaysLabelledOnlyOnceTheLabelIsSet: in label mode a pod the plugin
// skips is reported once and labelled. When the label cannot be set (here the
// agent lacks the pods/status grant), the report says labelling failed and why,
// not "labelled": the report was written before the label's patch and claimed it
// whatever the patch did. With the grant it says labelled, and the pod is.
func TestAReportSaysLabelledOnlyOnceTheLabelIsSet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grant   bool
		want    string
		notWant string
	}{
		{"label refused", false, "failed (tried again)", ": labelled"},
		{"label set", true, ": labelled " + DefaultLabelKey, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			admin := cp.AdminClient()
			cfg := testConfig("node-report-label")
			cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, false, true
			rules := []rbacv1.PolicyRule{rbacWatchPods, rbacEvents}
			if tc.grant {
				rules = append(rules, rbacLabelPod)
			}
			client := clientWithRules(t, cp, "repair-report-label", rules)
			pcfg, err := plugin.ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`))
			if err != nil {
				t.Fatal(err)
			}
			runController(t, cfg, client, Deps{Plugin: pcfg})

			skipped := createPod(t, admin, injectedPod("opted-out", cfg.NodeName, withLabel("sidecar.istio.io/inject", "false")))
			setValidation(t, admin, skipped, "10.1.0.1", 126, "")
			var reports []string
			waitFor(t, "the pod reported", 20*time.Second, func() (bool, error) {
				reports = nil
				for _, e := range eventsFor(t, admin, "opted-out") {
					if strings.Contains(e, " "+ReasonNotCaptured+": ") {
						reports = append(reports, e)
					}
				}
				return len(reports) > 0, nil
			})
			if len(reports) != 1 || !strings.Contains(reports[0], tc.want) || strings.Contains(reports[0], tc.notWant) {
				t.Errorf("reports %q: want one that says %q and not %q", reports, tc.want, tc.notWant)
			}
			if tc.grant {
				waitFor(t, "the pod labelled", 20*time.Second, func() (bool, error) {
					p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), "opted-out", metav1.GetOptions{})
					return err == nil && p.Labels[DefaultLabelKey] != "", err
				})
			}
		})
	}
}

// TestABrokenStaticPodIsReportedOnceAndNeverDeleted: a static pod's mirror (the
// kubelet's copy of it in the API server, kubernetes.io/config.mirror) is not the
// pod: deleting it does not restart the static pod, and the kubelet creates it
// again, broken the same way, which the delete action deleted again, without end.
// Against a real API server with the delete action's exact grants, a broken mirror
// is reported once, naming the fix, and never deleted over several failures of its
// validation; an ordinary broken pod beside it is deleted as before.
func TestABrokenStaticPodIsReportedOnceAndNeverDeleted(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-static")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, true, false
	c := runController(t, cfg, clientWithRules(t, cp, "repair-static", rulesFor(cfg)), Deps{})

	mirror := createPod(t, admin, injectedPod("web-node-static", cfg.NodeName, func(p *corev1.Pod) {
		p.Annotations[kube.MirrorAnnotation] = "0123456789abcdef0123456789abcdef"
	}))
	setValidation(t, admin, mirror, "10.1.0.1", 126, "")
	raced := createPod(t, admin, injectedPod("raced", cfg.NodeName))
	setValidation(t, admin, raced, "10.1.0.9", 126, "")
	waitFor(t, "the ordinary broken pod deleted", 20*time.Second, podDeleted(admin, "raced"))

	for pass := 1; pass <= 3; pass++ {
		before := c.Metrics().Detected.Load()
		p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), mirror.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		p.Status.InitContainerStatuses[0].RestartCount = int32(pass)
		setValidation(t, admin, p, "10.1.0.1", 126, fmt.Sprintf("pass %d", pass))
		waitFor(t, fmt.Sprintf("pass %d judged", pass), 20*time.Second, func() (bool, error) {
			return c.Metrics().Detected.Load() > before, nil
		})
	}

	p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), mirror.Name, metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp != nil || p.UID != mirror.UID {
		t.Fatalf("the static pod's mirror was deleted (%v): the kubelet only makes it again", err)
	}
	events := eventsFor(t, admin, mirror.Name)
	if len(events) != 1 || !strings.Contains(events[0], " "+ReasonStaticPod+": ") {
		t.Fatalf("events %q, want one %s", events, ReasonStaticPod)
	}
	for _, w := range []string{"static pod", kube.MirrorAnnotation, "not deleted", "staticPodPath"} {
		if !strings.Contains(events[0], w) {
			t.Errorf("event %q does not say %q", events[0], w)
		}
	}
	if got := c.Metrics().StaticPods.Load(); got != 1 {
		t.Errorf("static pods counter %d, want 1", got)
	}
	if n := c.Metrics().PodsRepaired(ActionDelete, ResultSuccess); n != 1 {
		t.Errorf("%d pods deleted, want 1 (the ordinary one)", n)
	}
}
