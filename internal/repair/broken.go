package repair

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Broken reports whether pod started without traffic redirection, by Istio's rule:
// it carries the sidecar annotation and its validation init container terminated
// with the configured exit code and message. It returns a sentence for events and
// logs when it is broken.
//
// As in Istio, a validation container whose current state is a successful exit is
// never broken, whatever happened before (it re-ran after a repair), and a failure
// is read from the last termination (the kubelet's CrashLoopBackOff state). Unlike
// Istio, a current termination counts too: the kubelet reports it first, before the
// container is restarted, so the failure is caught one restart earlier.
// Host-network pods never get the CNI, and pods being deleted need no repair.
func Broken(cfg *Config, pod *corev1.Pod) (bool, string) {
	st, t := failedRun(cfg, pod)
	if t == nil {
		return false, ""
	}
	return true, describe(st.Name, t, st.RestartCount)
}

// failedRun is the validation container's status and the termination of it that
// makes pod broken (Broken's rule); nil when the pod is not broken.
func failedRun(cfg *Config, pod *corev1.Pod) (*corev1.ContainerStatus, *corev1.ContainerStateTerminated) {
	if pod.DeletionTimestamp != nil || pod.Spec.HostNetwork {
		return nil, nil
	}
	if cfg.SidecarAnnotation != "" {
		if _, ok := pod.Annotations[cfg.SidecarAnnotation]; !ok {
			return nil, nil
		}
	}
	for i := range pod.Status.InitContainerStatuses {
		st := &pod.Status.InitContainerStatuses[i]
		if cfg.InitContainerName != "" && st.Name != cfg.InitContainerName {
			continue
		}
		if t := st.State.Terminated; t != nil {
			if t.ExitCode == 0 {
				continue
			}
			if cfg.matches(t) {
				return st, t
			}
		}
		if t := st.LastTerminationState.Terminated; t != nil && cfg.matches(t) {
			return st, t
		}
	}
	return nil, nil
}

// failureID names the run of the validation container whose failure makes pod
// broken: its container's ID (each run is a new container), with its start for a
// termination the runtime gave no ID (the kubelet's ContainerStatusUnknown). ""
// when the pod is not broken.
func failureID(cfg *Config, pod *corev1.Pod) string {
	_, t := failedRun(cfg, pod)
	switch {
	case t == nil:
		return ""
	case t.ContainerID != "":
		return t.ContainerID
	}
	return "@" + t.StartedAt.UTC().Format(time.RFC3339)
}

func (c *Config) matches(t *corev1.ContainerStateTerminated) bool {
	if t.ExitCode == 0 {
		return false
	}
	if c.InitExitCode != 0 && int(t.ExitCode) != c.InitExitCode {
		return false
	}
	want := strings.TrimSpace(c.InitTerminationMsg)
	return want == "" || want == strings.TrimSpace(t.Message)
}

func describe(name string, t *corev1.ContainerStateTerminated, restarts int32) string {
	s := fmt.Sprintf("init container %s exited with code %d", name, t.ExitCode)
	if m := strings.TrimSpace(t.Message); m != "" {
		if len(m) > 200 {
			m = m[:200] + "..."
		}
		s += fmt.Sprintf(" (%q)", m)
	}
	if restarts > 0 {
		s += fmt.Sprintf(" after %d restarts", restarts)
	}
	return s + ": the pod's traffic is not redirected to its sidecar"
}
