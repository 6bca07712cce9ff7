package repair

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A failed run of the validation container is named by its container's ID (each
// run is a new container): the same run seen again, as the kubelet's last
// termination after a restart, is the same failure whatever start time the status
// carries; only a termination without an ID is named by its start.
func TestFailureIDNamesTheRunByItsContainer(t *testing.T) {
	cfg := testConfig("node-a")
	at := func(s int) metav1.Time { return metav1.NewTime(time.Date(2026, 11, 27, 12, 0, s, 0, time.UTC)) }
	pod := func(current, last *corev1.ContainerStateTerminated) *corev1.Pod {
		p := injectedPod("web", "node-a")
		st := corev1.ContainerStatus{Name: DefaultInitContainerName}
		st.State.Terminated, st.LastTerminationState.Terminated = current, last
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
		return p
	}
	failed := func(id string, start metav1.Time) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: 126, ContainerID: id, StartedAt: start}
	}
	for _, tc := range []struct {
		name string
		a, b *corev1.Pod
		same bool
	}{
		{"the run, then its restart", pod(failed("containerd://run-1", at(1)), nil), pod(nil, failed("containerd://run-1", at(2))), true},
		{"another run", pod(failed("containerd://run-1", at(1)), nil), pod(failed("containerd://run-2", at(1)), nil), false},
		{"no ID, the same start", pod(failed("", at(1)), nil), pod(nil, failed("", at(1))), true},
		{"no ID, another start", pod(failed("", at(1)), nil), pod(failed("", at(5)), nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := failureID(&cfg, tc.a), failureID(&cfg, tc.b)
			if a == "" || b == "" {
				t.Fatalf("failureID = %q, %q: want both pods broken", a, b)
			}
			if (a == b) != tc.same {
				t.Errorf("failureID %q and %q: same = %v, want %v", a, b, a == b, tc.same)
			}
		})
	}
}
