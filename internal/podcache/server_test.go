package podcache_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

func pod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}, {Name: "istio-proxy", Image: "proxy"}}},
	}
}

// TestServesOnlyThisNodesPods: against a real API server, the cache answers for pods
// on its node (including ones created after it started), says "not found" for pods
// on other nodes, and its socket is root-only.
func TestServesOnlyThisNodesPods(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pods := cp.AdminClient().CoreV1().Pods("default")
	mine, err := pods.Create(ctx, pod("mine", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod("theirs", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), podcache.SocketName)
	srv := podcache.New(cp.AdminClient(), "node-a", nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	waitFor(t, func() bool { return srv.Synced() })
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v (%v), want 0600", st.Mode().Perm(), err)
	}
	c := kube.NewAgentClient(sock, time.Second)
	got, err := c.GetPod(ctx, "default", "mine")
	if err != nil {
		t.Fatalf("GetPod(mine): %v", err)
	}
	if got.Metadata.UID != string(mine.UID) || got.Spec.NodeName != "node-a" || len(got.Spec.Containers) != 2 {
		t.Errorf("GetPod(mine) = %+v", got)
	}
	if _, err := c.GetPod(ctx, "default", "theirs"); !errors.Is(err, kube.ErrNotFound) {
		t.Errorf("GetPod(theirs on node-b) error = %v, want not found", err)
	}
	if _, err := pods.Create(ctx, pod("later", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := c.GetPod(ctx, "default", "later"); return err == nil })
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after stop: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
