package daemonset

import (
	"fmt"
	"slices"

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
// and to keep them (NoExecute taints), with the tolerations it adds to each of
// its pods (daemonPodTolerations).
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
	tolerations := append(slices.Clip(spec.Tolerations), daemonPodTolerations...)
	taint, untolerated := schedcorev1.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, tolerations,
		func(t *corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoExecute }, false)
	if untolerated {
		return fmt.Sprintf("it does not tolerate the node's NoExecute taint %s=%s", taint.Key, taint.Value)
	}
	return ""
}

// daemonPodTolerations are the NoExecute tolerations the DaemonSet controller
// gives every pod it makes, whatever its template says
// (AddOrUpdateDaemonPodTolerations): the node lifecycle controller's taints of a
// node whose kubelet reports it not ready or has stopped reporting (a partition,
// an API server it cannot reach) neither evict a DaemonSet's pod nor keep one
// from being placed there.
var daemonPodTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
}
