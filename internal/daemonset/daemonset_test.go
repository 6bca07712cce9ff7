package daemonset

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestANodeThatWentSilentStillRunsTheDaemonSetsPod: the node lifecycle controller
// gives a node whose kubelet stops reporting (a partition, an API server it
// cannot reach) node.kubernetes.io/unreachable:NoExecute, and one whose kubelet
// reports it not ready node.kubernetes.io/not-ready:NoExecute. The DaemonSet
// controller adds tolerations of both to every pod it makes, whatever the
// template says, so its pod stays and it places one there: the DaemonSet still
// runs on the node. Only another NoExecute taint that the template does not
// tolerate excludes the node. Were the two counted, an agent stopped meanwhile
// would uninstall the plugin from a node its DaemonSet still runs on, and the
// taint controller would take the node for one no agent runs on.
func TestANodeThatWentSilentStillRunsTheDaemonSetsPod(t *testing.T) {
	noTolerations := &corev1.PodSpec{Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}}
	cases := []struct {
		name  string
		taint corev1.Taint
		want  string // "" or a part of the reason
	}{
		{"unreachable", corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}, ""},
		{"not ready", corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}, ""},
		{"another NoExecute taint", corev1.Taint{Key: "example.com/drain", Value: "now", Effect: corev1.TaintEffectNoExecute}, "example.com/drain=now"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{tc.taint}}}
			for _, running := range []bool{false, true} {
				got := Excludes(noTolerations, node, running, readinessTaint)
				if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
					t.Errorf("Excludes(running=%v) = %q, want %q", running, got, tc.want)
				}
			}
			if len(noTolerations.Tolerations) != 0 {
				t.Errorf("the template's tolerations were changed: %v", noTolerations.Tolerations)
			}
		})
	}
}

const readinessTaint = "cni.istio.io/not-ready"

// TestANoScheduleTaintKeepsANewPodOffButNotTheOneRunning: the DaemonSet
// controller places a pod only on a node whose NoSchedule taints its pod
// tolerates (shouldRun), but keeps one already there until a NoExecute taint
// evicts it (shouldContinueRunning). Its own NoSchedule tolerations count: a
// cordoned node, one under memory, disk or PID pressure, and, for a host-network
// pod such as the agent, one whose network is not set up yet, still get one.
// Were an untolerated NoSchedule taint (a dedicated node pool's) not counted, the
// taint controller would taint for good a node no agent ever comes to, and an
// agent leaving such a node would keep the plugin installed for a replacement
// that never comes. Two kinds of taint never count. The node readiness taint,
// whatever its effect: a DaemonSet that does not tolerate it would exclude the
// node the moment the taint controller sets it, and the controller would remove
// it again, in a loop. And the NoSchedule taints of a node not ready yet
// (registering, rebooting, not initialized by its cloud yet): they go once it is
// ready, and the DaemonSet controller places its pod then; counted, they would
// take the readiness taint off every new node just before it can take pods.
func TestANoScheduleTaintKeepsANewPodOffButNotTheOneRunning(t *testing.T) {
	agent := func(hostNetwork bool, tolerations ...corev1.Toleration) *corev1.PodSpec {
		return &corev1.PodSpec{HostNetwork: hostNetwork, Tolerations: tolerations,
			Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}}
	}
	noSchedule := func(key, value string) corev1.Taint {
		return corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule}
	}
	gpu := noSchedule("dedicated", "gpu")
	cases := []struct {
		name    string
		spec    *corev1.PodSpec
		taint   corev1.Taint
		running bool
		want    string // "" or a part of the reason
	}{
		{"a dedicated pool's NoSchedule taint keeps a new pod off", agent(true), gpu, false, "NoSchedule taint dedicated=gpu"},
		{"a dedicated pool's NoSchedule taint keeps the pod running there", agent(true), gpu, true, ""},
		{"a dedicated pool's NoSchedule taint tolerated", agent(true, corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpExists}), gpu, false, ""},
		{"the chart's tolerations: everything", agent(true, corev1.Toleration{Operator: corev1.TolerationOpExists}), gpu, false, ""},
		{"PreferNoSchedule never keeps a pod off", agent(true), corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectPreferNoSchedule}, false, ""},
		{"cordoned", agent(true), noSchedule(corev1.TaintNodeUnschedulable, ""), false, ""},
		{"memory pressure", agent(true), noSchedule(corev1.TaintNodeMemoryPressure, ""), false, ""},
		{"disk pressure", agent(true), noSchedule(corev1.TaintNodeDiskPressure, ""), false, ""},
		{"PID pressure", agent(true), noSchedule(corev1.TaintNodePIDPressure, ""), false, ""},
		{"network unavailable, host-network pod", agent(true), noSchedule(corev1.TaintNodeNetworkUnavailable, ""), false, ""},
		{"network unavailable, pod network: not ready yet", agent(false), noSchedule(corev1.TaintNodeNetworkUnavailable, ""), false, ""},
		{"registering or rebooting: not ready yet", agent(true), noSchedule(corev1.TaintNodeNotReady, ""), false, ""},
		{"not reporting: not ready yet", agent(true), noSchedule(corev1.TaintNodeUnreachable, ""), false, ""},
		{"not initialized by the cloud controller manager yet", agent(true), noSchedule("node.cloudprovider.kubernetes.io/uninitialized", "true"), false, ""},
		{"the readiness taint, not tolerated, new pod", agent(true), noSchedule(readinessTaint, "true"), false, ""},
		{"the readiness taint, not tolerated, running pod", agent(true), noSchedule(readinessTaint, "true"), true, ""},
		{"the readiness key with NoExecute", agent(true), corev1.Taint{Key: readinessTaint, Value: "true", Effect: corev1.TaintEffectNoExecute}, true, ""},
		{"an untolerated NoExecute taint evicts the running pod", agent(true), corev1.Taint{Key: "example.com/drain", Value: "now", Effect: corev1.TaintEffectNoExecute}, true, "NoExecute taint example.com/drain=now"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{tc.taint}}}
			got := Excludes(tc.spec, node, tc.running, readinessTaint)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Excludes(running=%v) = %q, want %q", tc.running, got, tc.want)
			}
		})
	}
}
