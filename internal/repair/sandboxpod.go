package repair

import (
	"errors"
	"fmt"
	"strings"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// ErrAnotherPodsNetns means the network namespace that holds a pod's address is,
// by its cgroup, another pod's sandbox: the pod's own sandbox is gone and the
// address was given to another pod before the pod's status (or the cache it was
// read from) caught up.
var ErrAnotherPodsNetns = errors.New("the network namespace holding the pod's address is another pod's")

// CheckSandboxOf refuses a namespace found by pod's address that is known to be
// another pod's: the kubelet's cgroup of the namespace's oldest process (its
// sandbox's pause process) names another pod uid (Netns.PodUID). A static pod's
// mirror is matched by the static pod's uid (kube.HasSandboxUID). A namespace
// whose cgroup names no pod (no process in it, a kubelet without pod cgroups,
// cgroupsPerQOS=false) is not refused: nothing says it is not the pod's.
//
// An address is found in a namespace only while it is held there, but the pod's
// status and the agent's cache of it lag the node: a pod whose sandbox died (or
// that was deleted while the agent's watch was behind) still shows the address
// that the network plugin has given to a pod started since. Programming that
// pod's namespace with this pod's capture would redirect its traffic to a proxy
// it may not run.
func (n *Netns) CheckSandboxOf(pod *kube.Pod) error {
	if n.PodUID == "" || kube.HasSandboxUID(pod.Metadata.UID, pod.Metadata.Annotations, n.PodUID) {
		return nil
	}
	return fmt.Errorf("%w: %s is the sandbox of pod uid %s by the cgroup of its process %s, not of pod %s (uid %s); "+
		"the pod's own sandbox is gone and its status is behind", ErrAnotherPodsNetns, n.Source, n.PodUID, n.Proc, pod.Key(), pod.Metadata.UID)
}

// PodUIDFromCgroup is the pod uid that a process's /proc/PID/cgroup names, as the
// kubelet names a pod's cgroup under its QoS class: "pod<uid>" with the cgroupfs
// driver (/kubepods/burstable/pod<uid>/<container>), and
// "kubepods-burstable-pod<uid>.slice" with the systemd driver, whose names carry
// the uid's "-" as "_". A uid is the API server's (a UUID) or a static pod's (32
// hex digits, the kubelet's hash of its manifest). Paths may be relative to the
// reader's cgroup namespace ("/../../kubepods-..."). Empty when no line names a
// pod, or when lines name different pods.
func PodUIDFromCgroup(data []byte) string {
	var found string
	for line := range strings.Lines(string(data)) {
		// hierarchy-ID:controllers:path; the path may hold ":".
		parts := strings.SplitN(strings.TrimRight(line, "\n"), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for seg := range strings.SplitSeq(parts[2], "/") {
			uid, ok := podUIDOfSegment(seg)
			if !ok {
				continue
			}
			if found != "" && found != uid {
				return ""
			}
			found = uid
		}
	}
	return found
}

// podUIDOfSegment reads the uid of one cgroup path segment that is a pod's cgroup.
func podUIDOfSegment(seg string) (string, bool) {
	name := seg
	if s, ok := strings.CutSuffix(seg, ".slice"); ok {
		// systemd: a slice's name is its parent's plus "-" and its own part; the
		// uid's own "-" are "_".
		name = s[strings.LastIndexByte(s, '-')+1:]
		name = strings.ReplaceAll(name, "_", "-")
	}
	uid, ok := strings.CutPrefix(name, "pod")
	if !ok || !isPodUID(uid) {
		return "", false
	}
	return uid, true
}

// isPodUID says whether s is shaped as a pod uid: a lower-case UUID, or the 32 hex
// digits of a static pod's.
func isPodUID(s string) bool {
	hex := func(s string) bool {
		for _, r := range s {
			if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
				return false
			}
		}
		return s != ""
	}
	if len(s) == 32 {
		return hex(s)
	}
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	return hex(s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:])
}
