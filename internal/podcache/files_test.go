package podcache

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/nofile"
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

// TestAPodFileThatCannotBeUpdatedIsRemoved: when a pod's new version cannot be
// written (here the process is out of descriptors, as on a node at its limit), its
// previous file must not stay: the plugin would take it for the pod as it is now
// (same name and uid) and miss the annotation changed since. Without the file the
// plugin asks the socket.
func TestAPodFileThatCannotBeUpdatedIsRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), kube.AgentPodFilesDir)
	f, err := openPodFiles(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	pod := func(ports string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "u-1",
			Annotations: map[string]string{"traffic.sidecar.istio.io/excludeOutboundPorts": ports}}}
	}
	f.write(pod("5432"))
	if _, err := kube.ReadAgentPodFile(dir, "default", "web-0"); err != nil {
		t.Fatal(err)
	}
	release := nofile.Exhaust(t, 0)
	f.write(pod("5432,6379"))
	release()
	if got, err := kube.ReadAgentPodFile(dir, "default", "web-0"); !errors.Is(err, kube.ErrNotFound) {
		t.Errorf("after a failed update the pod file holds %v (%v), want no file", got.Metadata.Annotations, err)
	}
	f.write(pod("5432,6379"))
	if got, err := kube.ReadAgentPodFile(dir, "default", "web-0"); err != nil || got.Metadata.Annotations["traffic.sidecar.istio.io/excludeOutboundPorts"] != "5432,6379" {
		t.Errorf("the next write: %v, %v", got, err)
	}
}
