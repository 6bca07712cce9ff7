package podcache

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// TestPodFilesRecreateTheirDirectoryWhenItIsRemoved: the directory removed under a
// running agent (by an agent of an older build stopping, or by hand) is made again,
// root's alone, on the next write, and is this agent's to remove when it stops.
func TestPodFilesRecreateTheirDirectoryWhenItIsRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), kube.AgentPodFilesDir)
	f, err := openPodFiles(dir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "u-1"}}
	f.write(p)
	path, _ := kube.AgentPodFile(dir, "default", "web-0")
	if _, err := kube.ReadAgentPodFile(dir, "default", "web-0"); err != nil {
		t.Errorf("no pod file at %s after the directory was removed: %v", path, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory made again: %v (%v), want mode 0700", fi, err)
	}
	f.close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the directory this agent made again is left once it stopped: %v", err)
	}
}
