package daemonset

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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

// AgentOn names (namespace/name) a DaemonSet of sets that runs an agent on node:
// its pod template carries the agent's labels (agents), it is not being deleted,
// and Excludes finds nothing; "" when none does. The node readiness controller
// asks it of every node; an exiting agent whose own DaemonSet leaves the node asks
// it too, as another DaemonSet of the agent (a canary beside the main one) still
// running there needs the plugin installed.
func AgentOn(sets []*appsv1.DaemonSet, agents labels.Selector, node *corev1.Node, running bool, readinessTaint string) string {
	for _, ds := range sets {
		if ds.DeletionTimestamp != nil || !agents.Matches(labels.Set(ds.Spec.Template.Labels)) {
			continue
		}
		if Excludes(&ds.Spec.Template.Spec, node, running, readinessTaint) == "" {
			return ds.Namespace + "/" + ds.Name
		}
	}
	return ""
}

// Excludes says why a DaemonSet with this pod template would not run a pod on
// node ("" when it would), as the DaemonSet controller decides it
// (NodeShouldRunDaemonPod), with the tolerations it adds to each of its pods
// (daemonPodTolerations). running says whether a pod of it is already on the
// node: the controller keeps that one unless a NoExecute taint it does not
// tolerate evicts it (shouldContinueRunning), but places a new one only where it
// tolerates the NoSchedule taints as well (shouldRun).
//
// Two kinds of taint never count. One with the key readinessTaint (the node
// readiness taint, TAINT_KEY): the taint controller sets it on a node whose agent
// is not ready, and were it counted, a DaemonSet that does not tolerate it would
// exclude the node the moment it is set, and the controller would remove it
// again, in a loop. And the NoSchedule taints of a node that is not ready yet
// (notReadyYet): they go once it is, and the DaemonSet controller then places its
// pod; were they counted, every node would be taken for one no agent comes to
// while it registers or reboots, and lose its readiness taint just before it
// can take pods.
func Excludes(spec *corev1.PodSpec, node *corev1.Node, running bool, readinessTaint string) string {
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
		func(t *corev1.Taint) bool {
			switch {
			case t.Key == readinessTaint:
				return false
			case t.Effect == corev1.TaintEffectNoExecute:
				return true
			case t.Effect == corev1.TaintEffectNoSchedule:
				return !running && !notReadyYet[t.Key]
			}
			return false
		}, false)
	switch {
	case !untolerated:
		return ""
	case taint.Effect == corev1.TaintEffectNoSchedule:
		return fmt.Sprintf("it does not tolerate the node's NoSchedule taint %s=%s, so the DaemonSet controller places no new pod there", taint.Key, taint.Value)
	default:
		return fmt.Sprintf("it does not tolerate the node's NoExecute taint %s=%s", taint.Key, taint.Value)
	}
}

// daemonPodTolerations are the tolerations the DaemonSet controller gives every
// pod it makes, whatever its template says (AddOrUpdateDaemonPodTolerations, the
// same in Kubernetes 1.33 to 1.37). The node lifecycle controller's NoExecute
// taints of a node whose kubelet reports it not ready or has stopped reporting
// (a partition, an API server it cannot reach) neither evict a DaemonSet's pod
// nor keep one from being placed there; nor do the NoSchedule taints of a node
// under memory, disk or PID pressure, or cordoned (kubectl cordon, kubectl drain).
var daemonPodTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// notReadyYet are the NoSchedule taints Kubernetes itself gives a node until it
// is ready, and removes then: the node lifecycle controller's while its kubelet
// reports it not ready or does not report (at registration, after a reboot), the
// route controller's until its pod network is set up (the DaemonSet controller
// tolerates this one for a host-network pod, such as the agent's), and, with an
// external cloud provider, the kubelet's until the cloud controller manager has
// initialized it.
var notReadyYet = map[string]bool{
	corev1.TaintNodeNotReady:                         true,
	corev1.TaintNodeUnreachable:                      true,
	corev1.TaintNodeNetworkUnavailable:               true,
	"node.cloudprovider.kubernetes.io/uninitialized": true,
}
