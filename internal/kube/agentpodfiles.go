package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/jsontree"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// AgentPodFilesDir is the directory, in the agent's run directory, where the agent
// keeps one file per pod of its node: the JSON its socket would answer, written
// when the pod's watch event arrives (package podcache). The plugin reads its pod
// there first: a file read needs no other process to be scheduled, which a
// request to the agent does, and on a node starting many pods at once the agent
// waits for a CPU as long as anything else.
//
// The plugin reads the files only while an agent keeps them current, which the
// agent says by holding a lock on AgentPodFilesLock, and only files of the format
// it knows (AgentPodFileVersion).
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

// AgentPodFileVersion is the format of the pod files that this build writes and
// reads: a pod file is the pod's JSON as the agent's socket answers it, with one
// member more, AgentPodFileVersionKey, holding this number (first in the file,
// so that a reader sees it at once). A plugin reads only files of its own
// version; any other, or none (an agent of a build before versions, which also
// holds no lock), is a file it does not know, and it asks the socket, then the
// API server, as for a missing file. Plugins of a build before versions ignore the
// member and read the pod as before.
//
// It changes only when a plugin of this version would misread the new format:
// during an upgrade the agent of one build and the plugin of the other meet, in
// both orders, and each then leaves the other's files alone.
const AgentPodFileVersion = 1

// AgentPodFileVersionKey is the member of a pod file that holds its format's
// version (AgentPodFileVersion). A pod's JSON has no member of that name.
const AgentPodFileVersionKey = "podFileVersion"

// ErrPodFilesNotKept is the error (errors.Is) of a read from a pod files directory
// that no agent keeps current now (no lock on AgentPodFilesLock).
var ErrPodFilesNotKept = errors.New("no live agent keeps the pod files (no process holds the lock on " + AgentPodFilesLock + ")")

// ErrPodFileVersion is the error (errors.Is) of a pod file whose format version
// is not AgentPodFileVersion.
var ErrPodFileVersion = errors.New("a pod file format this plugin does not read")

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

// EncodeAgentPodFile is the content of a pod's file: pod, the pod's JSON object
// as the socket answers it, with the format's version put first
// (AgentPodFileVersionKey).
func EncodeAgentPodFile(pod []byte) ([]byte, error) {
	if len(pod) < 2 || pod[0] != '{' || pod[len(pod)-1] != '}' {
		return nil, fmt.Errorf("agent pod file: the pod's JSON is not an object: %s", redirect.Quote(string(pod)))
	}
	out := make([]byte, 0, len(pod)+len(AgentPodFileVersionKey)+8)
	out = append(out, `{"`+AgentPodFileVersionKey+`":`+strconv.Itoa(AgentPodFileVersion)...)
	if rest := strings.TrimSpace(string(pod[1 : len(pod)-1])); rest != "" {
		out = append(out, ',')
	}
	return append(out, pod[1:]...), nil
}

// ReadAgentPodFile reads pod namespace/name from the agent's pod files in dir.
// ErrPodFilesNotKept when no agent keeps the files now (not running, killed, or
// its watch has not listed the node's pods yet: AgentPodFilesLock), ErrNotFound
// when there is no file (the agent has not seen the pod yet, or the name is not a
// pod name), ErrPodFileVersion for a file of another format (another build's
// agent: AgentPodFileVersion). The lock is looked at before the file is read, so
// a file read is one the live agent wrote or would have replaced. The file is
// read whole, at most MaxAnswerBytes, as an answer of the socket would be, and
// without waiting: anything but a regular file (a FIFO) is refused at once.
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
	doc, err := jsontree.Document(data)
	if err != nil {
		return nil, fmt.Errorf("agent pod file %s: decode: %w", path, err)
	}
	if v, known := agentPodFileVersion(doc); !known {
		return nil, fmt.Errorf("agent pod file %s: format version %s, this plugin reads %d: %w", path, v, AgentPodFileVersion, ErrPodFileVersion)
	}
	var pod Pod
	if err := decodePodDoc(doc, &pod); err != nil {
		return nil, fmt.Errorf("agent pod file %s: decode: %w", path, err)
	}
	return &pod, nil
}

// agentPodFileVersion is the version a pod file's document holds, as written
// ("none" without one), and whether it is AgentPodFileVersion. Of members given
// twice the last counts, as encoding/json's.
func agentPodFileVersion(doc jsontree.Value) (seen string, known bool) {
	var v *jsontree.Value
	for _, m := range doc.Members() {
		if m.Key == AgentPodFileVersionKey {
			v = &m.Value
		}
	}
	if v == nil {
		return "none", false
	}
	n, ok := v.Int64()
	return redirect.Quote(string(v.Raw())), v.Kind == jsontree.Number && ok && n == AgentPodFileVersion
}
