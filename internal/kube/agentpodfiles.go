package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// AgentPodFilesDir is the directory, in the agent's run directory, where the agent
// keeps one file per pod of its node: the JSON its socket would answer, written
// when the pod's watch event arrives (package podcache). The plugin reads its pod
// there first: a file read needs no other process to be scheduled, which a
// request to the agent does, and on a node starting many pods at once the agent
// waits for a CPU as long as anything else.
//
// The plugin reads the files only while an agent keeps them current, which the
// agent says by holding a lock on AgentPodFilesLock.
const AgentPodFilesDir = "pods"

// AgentPodFilesLock is the file in AgentPodFilesDir on which the agent that made
// the directory holds a write lock (fcntl's F_OFD_SETLK, the lock of an open file
// description) from the moment its watch of the node's pods has listed them all
// and their files are written until it stops keeping them. The kernel drops the
// lock when the agent dies, however it dies (SIGKILL, the OOM killer, its pod
// deleted without a grace period): its files stay on disk, but nothing rewrites
// them when a pod changes, so a plugin that finds no lock reads none of them and
// asks the socket, then the API server, as for a missing file. So do a node
// rebooted with a run directory that is not tmpfs, and an earlier agent's
// directory, which has no lock file. The plugin only asks (F_OFD_GETLK), so it
// never delays the agent nor another plugin. Its name starts with a dot, which
// no pod's file does (AgentPodFile).
const AgentPodFilesLock = ".lock"

// ErrPodFilesNotKept is the error (errors.Is) of a read from a pod files directory
// that no agent keeps current now (no lock on AgentPodFilesLock).
var ErrPodFilesNotKept = errors.New("no live agent keeps the pod files (no process holds the lock on " + AgentPodFilesLock + ")")

// AgentPodFile is the file of pod namespace/name in dir (AgentPodFilesDir under
// the agent's run directory). Namespaces are DNS labels and pod names DNS
// subdomains, neither holds "_", so the name is unambiguous; ok is false for a
// name that could leave dir.
func AgentPodFile(dir, namespace, name string) (path string, ok bool) {
	for _, s := range []string{namespace, name} {
		if s == "" || s[0] == '.' || strings.ContainsAny(s, "/_\x00") {
			return "", false
		}
	}
	return filepath.Join(dir, namespace+"_"+name+".json"), true
}

// ReadAgentPodFile reads pod namespace/name from the agent's pod files in dir.
// ErrPodFilesNotKept when no agent keeps the files now (not running, killed, or
// its watch has not listed the node's pods yet: AgentPodFilesLock), ErrNotFound
// when there is no file (the agent has not seen the pod yet, or the name is not a
// pod name). The lock is looked at before the file is read, so a file read is one
// the live agent wrote or would have replaced. The file is read whole, at most
// MaxAnswerBytes, as an answer of the socket would be, and without waiting:
// anything but a regular file (a FIFO) is refused at once.
func ReadAgentPodFile(dir, namespace, name string) (*Pod, error) {
	path, ok := AgentPodFile(dir, namespace, name)
	if !ok {
		return nil, fmt.Errorf("agent pod file: %w", ErrNotFound)
	}
	switch kept, err := agentPodFilesKept(dir); {
	case err != nil:
		return nil, fmt.Errorf("agent pod files %s: lock: %w", dir, err)
	case !kept:
		return nil, fmt.Errorf("agent pod files %s: %w", dir, ErrPodFilesNotKept)
	}
	data, err := readBounded(path, MaxAnswerBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("agent pod file: %w", ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("agent pod file: %w", err)
	}
	var pod Pod
	if err := decodePod(data, &pod); err != nil {
		return nil, fmt.Errorf("agent pod file %s: decode: %w", path, err)
	}
	return &pod, nil
}
