package plugin

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/poll"
)

// TestLookupWaitsForTheAgentsWatch: against a real API server and the agent's real
// pod cache, a pod created while the plugin's request is held by the agent (its
// watch has not brought the pod yet) is answered by the agent once the event
// comes, not by the API server. The wait is widened here (agentPodWait) so that the
// event's arrival on a loaded machine cannot make the test flaky.
func TestLookupWaitsForTheAgentsWatch(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	prev := agentPodWait
	agentPodWait = podcache.MaxWait
	t.Cleanup(func() { agentPodWait = prev })

	cfg := &Config{Kubeconfig: cp.AdminKubeconfig(), AgentRunDir: t.TempDir()}
	nodePods := informer.NewNodePods(cp.AdminClient().CoreV1(), "node-w")
	srv := podcache.NewOnNodePods(cp.AdminClient(), nodePods, nil)
	sock := filepath.Join(cfg.AgentRunDir, PodCacheSocketName)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	go nodePods.Run(ctx)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the pod cache is synced", srv.Synced)

	pods := cp.AdminClient().CoreV1().Pods("default")
	created := make(chan *corev1.Pod, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the plugin's request is held by then
		p, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: "node-w", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Error(err)
		}
		created <- p
	}()
	var buf bytes.Buffer
	log := pluginlog.New(&buf, pluginlog.Options{Level: slog.LevelDebug})
	defer log.Close()
	got, err := (&Plugin{}).lookup(ctx, cfg, PodArgs{Name: "web", Namespace: "default"}, log, PodLookup{Retries: 1, Interval: time.Second})
	p := <-created
	if err != nil {
		t.Fatalf("lookup: %v\n%s", err, buf.String())
	}
	if p == nil || got.Metadata.UID != string(p.UID) {
		t.Fatalf("lookup found uid %q, want the created pod's", got.Metadata.UID)
	}
	if !strings.Contains(buf.String(), "pod found in the agent's cache") || strings.Contains(buf.String(), "asking the API server") {
		t.Errorf("the pod was not the agent's answer after its wait; the plugin's log:\n%s", buf.String())
	}
	if n := srv.Waits.Found.Load(); n != 1 {
		t.Errorf("the agent counted %d requests found after a wait, want 1", n)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("pod cache: %v", err)
	}
}
