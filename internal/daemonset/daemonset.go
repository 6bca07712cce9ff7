package daemonset

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// ControllerOf is the DaemonSet that controls pod, or nil.
func ControllerOf(pod *corev1.Pod) *metav1.OwnerReference {
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
		return ref
	}
	return nil
}

// Excludes says why a DaemonSet with this pod template would not run a pod on
// node ("" when it would): what the DaemonSet controller checks to place its pods
// and to keep them (NoExecute taints).
func Excludes(spec *corev1.PodSpec, node *corev1.Node) string {
	pod := &corev1.Pod{Spec: *spec}
	match, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
	if err != nil {
		// A selector the API server accepted but that does not parse here: not ours to
		// judge, it runs there.
		return ""
	}
	if !match {
		return "its node selector or required node affinity does not match the node's labels"
	}
	taint, untolerated := schedcorev1.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, spec.Tolerations,
		func(t *corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoExecute }, false)
	if untolerated {
		return fmt.Sprintf("it does not tolerate the node's NoExecute taint %s=%s", taint.Key, taint.Value)
	}
	return ""
}
