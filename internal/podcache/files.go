package podcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// podFiles keeps one file per pod of the node in dir (kube.AgentPodFile), the
// JSON the socket would answer, so the plugin can read its pod without a request
// to this process (see kube.AgentPodFilesDir). Each file is replaced whole by a
// rename, so a reader sees the old content or the new, never part of one. The
// directory and its files are root's alone (0700, 0600), as the socket is.
type podFiles struct {
	dir string
	log *slog.Logger

	mu     sync.Mutex
	closed bool
}

// openPodFiles empties dir (files of a previous agent may be stale) and creates it.
func openPodFiles(dir string, log *slog.Logger) (*podFiles, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("pod files: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pod files: %w", err)
	}
	return &podFiles{dir: dir, log: log}, nil
}

// handler writes a pod's file on each add and update and removes it on delete.
func (f *podFiles) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    f.write,
		UpdateFunc: func(_, obj any) { f.write(obj) },
		DeleteFunc: f.remove,
	}
}

// fileOf is obj's pod and the path of its file; ok is false for anything else
// (a tombstone is unwrapped).
func (f *podFiles) fileOf(obj any) (pod *corev1.Pod, path string, ok bool) {
	if t, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
		obj = t.Obj
	}
	if pod, ok = obj.(*corev1.Pod); !ok {
		return nil, "", false
	}
	path, ok = kube.AgentPodFile(f.dir, pod.Namespace, pod.Name)
	return pod, path, ok
}

func (f *podFiles) write(obj any) {
	pod, path, ok := f.fileOf(obj)
	if !ok {
		return
	}
	data, err := json.Marshal(pod)
	if err != nil {
		f.warn("encode", pod, err)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	tmp, err := os.CreateTemp(f.dir, ".tmp-*")
	if err != nil {
		f.warn("create", pod, err)
		return
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		f.warn("write", pod, err)
	}
}

func (f *podFiles) remove(obj any) {
	pod, path, ok := f.fileOf(obj)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) && !f.closed {
		f.warn("remove", pod, err)
	}
}

// close stops the writes and removes the directory: without the agent, nothing
// keeps the files current.
func (f *podFiles) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if err := os.RemoveAll(f.dir); err != nil {
		f.log.Warn("pod files: remove", "dir", f.dir, "error", err)
	}
}

func (f *podFiles) warn(what string, pod *corev1.Pod, err error) {
	// The plugin then asks the socket or the API server: worth a warning, not more.
	f.log.Warn("pod files: "+what, "pod", pod.Namespace+"/"+pod.Name, "error", err)
}

// filesDir is the pod files' directory beside the socket at path.
func filesDir(socketPath string) string {
	return filepath.Join(filepath.Dir(socketPath), kube.AgentPodFilesDir)
}
