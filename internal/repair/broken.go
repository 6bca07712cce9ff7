package repair

import (
	"fmt"
	"strings"

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
	if pod.DeletionTimestamp != nil || pod.Spec.HostNetwork {
		return false, ""
	}
	if cfg.SidecarAnnotation != "" {
		if _, ok := pod.Annotations[cfg.SidecarAnnotation]; !ok {
			return false, ""
		}
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if cfg.InitContainerName != "" && st.Name != cfg.InitContainerName {
			continue
		}
		if t := st.State.Terminated; t != nil {
			if t.ExitCode == 0 {
				continue
			}
			if cfg.matches(t) {
				return true, describe(st.Name, t, st.RestartCount)
			}
		}
		if t := st.LastTerminationState.Terminated; t != nil && cfg.matches(t) {
			return true, describe(st.Name, t, st.RestartCount)
		}
	}
	return false, ""
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
