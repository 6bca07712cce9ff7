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
	"github.com/istio-cni/istio-cni/internal/ownfile"
)

// podFiles keeps one file per pod of the node in dir (kube.AgentPodFile), the
// JSON the socket would answer with the format's version
// (kube.EncodeAgentPodFile), so the plugin can read its pod without a request to
// this process (see kube.AgentPodFilesDir). Each file is replaced whole by a
// rename, so a reader sees the old content or the new, never part of one. The
// directory and its files are root's alone (0700, 0600), as the socket is.
//
// The plugin reads the files only while their lock is held
// (kube.AgentPodFilesLock): this process holds it on the directory it made, from
// the moment every pod the watch listed is written (synced) until close, and the
// kernel drops it if this process dies. A killed agent's files are then read by
// no plugin, though they stay until the next agent empties the directory.
//
// Two agents may run on the node at once (a rolling update: both mount the run
// directory from the host). The new one replaces the directory, and holds the
// lock of its own; the old one, still running, writes into that one (the same
// pods, from the same API server) and, on close, leaves it: it removes the
// directory only if it is still the one it made. Its lock is on its own
// directory's file, gone from the path, which no plugin looks at.
type podFiles struct {
	dir string
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	// held is the directory this process made, held open so that its inode is not
	// given to another's (ownfile); own is its Stat.
	held *os.File
	own  os.FileInfo
	// synced: every pod the watch listed has been written (the handler's
	// registration has synced); the lock is taken on a directory held from then on.
	synced bool
	// unlock releases the lock on held's kube.AgentPodFilesLock; nil while none is held.
	unlock func()
}

// openPodFiles empties dir (files of a previous agent may be stale) and makes it
// anew, as this process's own.
func openPodFiles(dir string, log *slog.Logger) (*podFiles, error) {
	f := &podFiles{dir: dir, log: log}
	for try := 1; ; try++ {
		if err := os.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("pod files: %w", err)
		}
		made, err := f.makeDir()
		if err != nil {
			return nil, err
		}
		if made {
			return f, nil
		}
		// An earlier agent, still running, made it again between the removal and
		// this one's mkdir (its write found none): its directory, which it would
		// remove on its exit. Removed too, and made again.
		if try == maxTakeoverTries {
			return nil, fmt.Errorf("pod files: %s made again by another process %d times in a row", dir, try)
		}
	}
}

// maxTakeoverTries bounds openPodFiles' removals of a directory another process
// keeps making again.
const maxTakeoverTries = 5

// makeDir makes the directory and holds it as this process's own (made), so
// that close removes it. A directory that is there already is another process's
// (an agent that took over: it removes it on its exit); it is written into but
// not held, so that this process's close leaves it. Under mu, or before the
// handler runs.
func (f *podFiles) makeDir() (made bool, err error) {
	f.release()
	if f.held != nil {
		f.held.Close()
		f.held, f.own = nil, nil
	}
	if err := os.MkdirAll(filepath.Dir(f.dir), 0o700); err != nil {
		return false, fmt.Errorf("pod files: %w", err)
	}
	if err := os.Mkdir(f.dir, 0o700); errors.Is(err, fs.ErrExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("pod files: %w", err)
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return false, fmt.Errorf("pod files: %w", err)
	}
	fi, err := d.Stat()
	if err != nil {
		d.Close()
		return false, fmt.Errorf("pod files: %w", err)
	}
	f.held, f.own = d, fi
	f.lock()
	return true, nil
}

// markSynced says that every pod the watch listed is written: the files are
// current, and the lock that tells the plugin so is taken (on the directory this
// process holds).
func (f *podFiles) markSynced() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.synced = true
	f.lock()
}

// lock takes the lock of the directory this process made, once synced. Without
// it the plugin reads no file and asks the socket: worth a warning, not more, and
// the next write tries again. Under mu, or before the handler runs.
func (f *podFiles) lock() {
	if !f.synced || f.held == nil || f.unlock != nil {
		return
	}
	unlock, err := kube.KeepAgentPodFiles(f.held)
	if err != nil {
		f.log.Warn("pod files: the plugin will not read them", "dir", f.dir, "error", err)
		return
	}
	f.unlock = unlock
}

// release drops the lock, if held. Under mu, or before the handler runs.
func (f *podFiles) release() {
	if f.unlock != nil {
		f.unlock()
		f.unlock = nil
	}
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
	if err == nil {
		data, err = kube.EncodeAgentPodFile(data)
	}
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
	if errors.Is(err, fs.ErrNotExist) {
		// Removed under this process (an agent stopping on an old build, or by hand):
		// made again, this process's own now, unless another made it meanwhile.
		var made bool
		if made, err = f.makeDir(); err == nil {
			if made {
				f.log.Info("pod files: the directory was removed; made it again", "dir", f.dir)
			}
			tmp, err = os.CreateTemp(f.dir, ".tmp-*")
		}
	}
	if err != nil {
		f.dropStale(pod, path, "create", err)
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
		f.dropStale(pod, path, "write", err)
		return
	}
	f.lock() // again, if it could not be taken (a full run dir)
}

// dropStale removes the pod's file after its new version could not be written (a
// full run dir, no descriptor left): the old version, which the plugin would take
// for the pod's current one (same name, same uid), may lack an annotation changed
// since. Without a file the plugin asks the socket, which answers from the
// informer. Under mu.
func (f *podFiles) dropStale(pod *corev1.Pod, path, what string, err error) {
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = fmt.Errorf("%w; and its previous file stays: %w", err, rerr)
	}
	f.warn(what, pod, err)
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

// close stops the writes, releases the lock (the plugin reads the files no more)
// and removes the directory: without the agent, nothing keeps the files current. A
// directory another agent has made in its place since (it took over) is that
// agent's, kept current and locked by it, and stays.
func (f *podFiles) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.release()
	if err := ownfile.RemoveAll(f.dir, f.own); err != nil {
		f.log.Warn("pod files: remove", "dir", f.dir, "error", err)
	}
	if f.held != nil {
		f.held.Close()
		f.held = nil
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
