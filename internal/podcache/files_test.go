package podcache

import (
	"bytes"
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
// root's alone, on the next write, kept (its lock held again, so the plugin reads
// it), and is this agent's to remove when it stops.
func TestPodFilesRecreateTheirDirectoryWhenItIsRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), kube.AgentPodFilesDir)
	f, err := openPodFiles(dir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	f.markSynced()
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
	f.markSynced()
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

// TestPodFilesNeverHoldADirectoryAnotherAgentMade: during a rolling update the new
// agent empties the directory and makes it again; the old one, still running,
// makes it again itself when a write finds it gone. When the old one's mkdir
// comes between the new one's removal and mkdir, both took the one directory for
// their own, and the old one's exit removed the new one's pod files (the plugin
// then asked the socket for every pod until each changed). A directory that is
// there already is another process's: written into, never held, left on close;
// the new agent's open removes it and makes its own.
func TestPodFilesNeverHoldADirectoryAnotherAgentMade(t *testing.T) {
	dir := filepath.Join(t.TempDir(), kube.AgentPodFilesDir)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	old, err := openPodFiles(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	old.markSynced()
	if err := os.RemoveAll(dir); err != nil { // the new agent's open, first step
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "u-1"}}
	old.write(pod) // finds no directory: makes it again, its own
	// The new agent's open, second step: the directory is there, the old one's.
	nu := &podFiles{dir: dir, log: log}
	made, err := nu.makeDir()
	if err != nil {
		t.Fatal(err)
	}
	if made {
		t.Error("makeDir took the directory another process made for its own")
	}
	nu.close() // holds nothing: leaves the old one's directory
	if _, err := kube.ReadAgentPodFile(dir, "default", "web-0"); err != nil {
		t.Errorf("closing a podFiles that did not make the directory removed it: %v", err)
	}

	// The new agent's open from the start: its own directory, whatever the old does.
	nu, err = openPodFiles(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	defer nu.close()
	nu.markSynced()
	nu.write(pod)
	old.write(pod) // the directory is there (the new one's): written into, not held
	old.close()
	if _, err := kube.ReadAgentPodFile(dir, "default", "web-0"); err != nil {
		t.Errorf("the old agent's exit removed the new agent's pod files, or released their lock: %v", err)
	}
}

// TestPodFilesAreReadOnlyFromSyncUntilClose: the plugin reads no file before every
// pod the watch listed is written (a new agent's files are being written anew),
// reads them from then on, in this build's format, and reads none once the agent
// stops keeping them: the lock is released, not only its directory removed (a
// directory that cannot be removed stays).
func TestPodFilesAreReadOnlyFromSyncUntilClose(t *testing.T) {
	dir := filepath.Join(t.TempDir(), kube.AgentPodFilesDir)
	f, err := openPodFiles(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.write(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "u-1"}})
	read := func() error { _, err := kube.ReadAgentPodFile(dir, "default", "web-0"); return err }
	if err := read(); !errors.Is(err, kube.ErrPodFilesNotKept) {
		t.Errorf("before sync: %v, want %v", err, kube.ErrPodFilesNotKept)
	}
	f.markSynced()
	if err := read(); err != nil {
		t.Errorf("synced: %v, want the pod", err)
	}
	path, _ := kube.AgentPodFile(dir, "default", "web-0")
	if data, err := os.ReadFile(path); err != nil || !bytes.HasPrefix(data, []byte(`{"podFileVersion":1,"metadata":`)) {
		t.Errorf("the pod's file holds %s (%v), want the pod's JSON with the format version first", data, err)
	}
	// The lock file and the pod's file linked into another directory: the same
	// inodes, which close's removal of the directory leaves.
	linked := t.TempDir()
	for _, name := range []string{kube.AgentPodFilesLock, filepath.Base(path)} {
		if err := os.Link(filepath.Join(dir, name), filepath.Join(linked, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.ReadAgentPodFile(linked, "default", "web-0"); err != nil {
		t.Fatalf("the linked files, kept: %v", err)
	}
	f.close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the directory after close: %v, want it removed", err)
	}
	if _, err := kube.ReadAgentPodFile(linked, "default", "web-0"); !errors.Is(err, kube.ErrPodFilesNotKept) {
		t.Errorf("closed: %v, want %v (the lock released)", err, kube.ErrPodFilesNotKept)
	}
}
