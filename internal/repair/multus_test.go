package repair

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// linesWith counts the lines of the log that hold every one of parts.
func linesWith(log *logbuf.Buffer, parts ...string) int {
	n := 0
	for _, line := range strings.Split(log.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

func withNetworks(v string) podOpt {
	return func(p *corev1.Pod) { p.Annotations[multus.NetworksAnnotation] = v }
}

// TestPodMissingItsMultusNetworkIsLabelledAndReportedOnceAndNeverDeleted: in Multus
// mode a meshed pod whose k8s.v1.cni.cncf.io/networks annotation does not name
// istio-cni never reaches the plugin, so its validation fails for as long as it
// lives. With the chart's default action (delete), the controller labels it,
// reports it with one event and one log line naming the annotation to add, and
// never deletes it: not over several status changes, nor after the agent
// restarts. A pod that does name the network and failed is the race, and is
// deleted as before, in the same run.
func TestPodMissingItsMultusNetworkIsLabelledAndReportedOnceAndNeverDeleted(t *testing.T) {
	cp := startControlPlane(t)
	admin := cp.AdminClient()
	cfg := testConfig("node-multus")
	cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, true, true
	cfg.MultusNetwork = multus.DefaultNetworkName
	client := clientWithRules(t, cp, "repair-multus", rulesFor(cfg))
	var logs logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))

	missing := map[string]string{
		"no-annotation": "",                                         // want: add k8s.v1.cni.cncf.io/networks: istio-cni
		"other-network": "macvlan@net1",                             // want: add istio-cni to it
		"json-list":     `[{"name":"macvlan","namespace":"infra"}]`, // want: add {"name":"istio-cni"} to it
		"unparsable":    "bookinfo/istio-cni,",                      // names it, but does not parse as a whole
	}
	runs := 0
	run := func() (*Controller, func()) {
		runs++
		c, err := New(cfg, client, Deps{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		stop := background.Run(t, c.Run)
		waitFor(t, fmt.Sprintf("controller %d synced", runs), 30*time.Second, func() (bool, error) { return c.HasSynced(), nil })
		return c, stop
	}
	c, stop := run()
	for name, value := range missing {
		var opts []podOpt
		if value != "" {
			opts = append(opts, withNetworks(value))
		}
		p := createPod(t, admin, injectedPod(name, cfg.NodeName, opts...))
		setValidation(t, admin, p, "10.1.0.1", 126, "")
	}
	raced := createPod(t, admin, injectedPod("raced", cfg.NodeName, withNetworks("istio-cni")))
	setValidation(t, admin, raced, "10.1.0.9", 126, "")
	waitFor(t, "the pod that names the network deleted", 20*time.Second, podDeleted(admin, "raced"))

	// Pass after pass, the kubelet restarts the validation container, which fails
	// again; and the agent restarts once in between.
	for pass := 1; pass <= 4; pass++ {
		if pass == 3 {
			stop()
			c, stop = run()
		}
		before := c.Metrics().Detected.Load()
		for name := range missing {
			p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("pass %d: pod %s: %v", pass, name, err)
			}
			p.Status.InitContainerStatuses[0].RestartCount = int32(pass)
			setValidation(t, admin, p, "10.1.0.1", 126, fmt.Sprintf("pass %d", pass))
		}
		waitFor(t, fmt.Sprintf("pass %d judged", pass), 20*time.Second, func() (bool, error) {
			return c.Metrics().Detected.Load() >= before+uint64(len(missing)), nil
		})
	}

	for name, value := range missing {
		p, err := admin.CoreV1().Pods(testNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("pod %s deleted (%v), but its replacement would miss the network too", name, err)
			continue
		}
		if p.Labels[DefaultLabelKey] != DefaultLabelValue {
			t.Errorf("pod %s labels %v, want %s=%s", name, p.Labels, DefaultLabelKey, DefaultLabelValue)
		}
		var reports []string
		for _, e := range eventsFor(t, admin, name) {
			if strings.Contains(e, " "+ReasonMissingNetwork+": ") {
				reports = append(reports, e)
			} else {
				t.Errorf("pod %s: event %q, want only %s", name, e, ReasonMissingNetwork)
			}
		}
		if len(reports) != 1 {
			t.Errorf("pod %s: %d %s events, want 1: %q", name, len(reports), ReasonMissingNetwork, reports)
			continue
		}
		want := []string{"Multus never runs istio-cni", "not deleted", "labelled " + DefaultLabelKey}
		switch name {
		case "no-annotation":
			want = append(want, "has no k8s.v1.cni.cncf.io/networks annotation", `Add k8s.v1.cni.cncf.io/networks: istio-cni to`)
		case "other-network":
			want = append(want, `annotation "macvlan@net1" does not name istio-cni`, `Add k8s.v1.cni.cncf.io/networks: macvlan@net1,istio-cni to`)
		case "json-list":
			want = append(want, "does not name istio-cni", `Add {"name":"istio-cni"} to the list in k8s.v1.cni.cncf.io/networks`)
		default:
			want = append(want, "does not parse", value)
		}
		for _, w := range want {
			if !strings.Contains(reports[0], w) {
				t.Errorf("pod %s: event %q does not say %q", name, reports[0], w)
			}
		}
		if n := linesWith(&logs, "pod="+testNS+"/"+name+" ", "Multus never runs"); n != 1 {
			t.Errorf("pod %s: %d log lines report it, want 1", name, n)
		}
	}
	if n := linesWith(&logs, "deleted broken pod", "pod="+testNS+"/raced "); n != 1 {
		t.Errorf("%d log lines say the pod that names the network was deleted, want 1", n)
	}
}
