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
			got := Excludes(noTolerations, node)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Excludes = %q, want %q", got, tc.want)
			}
			if len(noTolerations.Tolerations) != 0 {
				t.Errorf("the template's tolerations were changed: %v", noTolerations.Tolerations)
			}
		})
	}
}
