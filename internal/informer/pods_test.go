package informer_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/test/harness/pods"
)

// TestTrimPodKeepsWhatThePluginAndRepairRead: the one transform of the node's shared
// pod informer drops managed fields and status conditions, and nothing that the
// pod cache's reader (the plugin, through kube.Pod) or the repair controller (its
// broken-pod rule, its in-place repair, its label and delete preconditions) uses.
func TestTrimPodKeepsWhatThePluginAndRepairRead(t *testing.T) {
	cfg := repair.DefaultConfig()
	cfg.NodeName = "node-a"
	uid, user := int64(1337), int64(1000)
	full := pods.Injected("apps", "web", "node-a", func(p *corev1.Pod) {
		p.UID, p.ResourceVersion = "6f1c", "42"
		p.Labels = map[string]string{"app": "web", cfg.LabelKey: cfg.LabelValue}
		p.Annotations["k8s.v1.cni.cncf.io/networks"] = "istio-cni"
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &user}
		p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{RunAsUser: &uid}
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
		p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "ISTIO_META_INTERCEPTION_MODE", Value: "REDIRECT"}}
		p.Status = corev1.PodStatus{
			Phase: corev1.PodPending, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}, {IP: "fd00::7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			InitContainerStatuses: []corev1.ContainerStatus{{
				Name: "istio-validation", RestartCount: 2,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Message: "not redirected"}},
			}},
		}
	})
	obj, err := informer.TrimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	trimmed := obj.(*corev1.Pod)
	if trimmed.ManagedFields != nil || trimmed.Status.Conditions != nil {
		t.Errorf("TrimPod kept managed fields %v and conditions %v, want both dropped", trimmed.ManagedFields, trimmed.Status.Conditions)
	}

	// The plugin's view (what the pod cache serves, and what repair in place plans from).
	var views []*kube.Pod
	for _, p := range []*corev1.Pod{full, trimmed} {
		v, err := repair.KubePod(p)
		if err != nil {
			t.Fatal(err)
		}
		views = append(views, v)
	}
	if diff := cmp.Diff(views[0], views[1]); diff != "" {
		t.Errorf("the plugin's view of the pod changed by TrimPod (-before +after):\n%s", diff)
	}
	// Repair's rule and what its actions read.
	b1, why1 := repair.Broken(&cfg, full)
	b2, why2 := repair.Broken(&cfg, trimmed)
	if !b1 || b1 != b2 || why1 != why2 {
		t.Errorf("Broken before TrimPod = %v %q, after = %v %q, want the same, broken", b1, why1, b2, why2)
	}
	keep := func(p *corev1.Pod) []any {
		return []any{p.UID, p.ResourceVersion, p.Labels, p.Annotations, p.DeletionTimestamp, p.Spec, p.Status.InitContainerStatuses}
	}
	if diff := cmp.Diff(keep(full), keep(trimmed)); diff != "" {
		t.Errorf("TrimPod changed what repair reads (-before +after):\n%s", diff)
	}
}
