package informer_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/daemonset"
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

// TestTrimNodeKeepsWhatTheTaintControllerReads: the taint leader's Node cache keeps
// what its decisions read (the DaemonSet's node selector, affinity and tolerations
// against the labels, name and taints; the patch's resourceVersion) and drops the
// status, annotations and managed fields, which were most of each cached Node.
func TestTrimNodeKeepsWhatTheTaintControllerReads(t *testing.T) {
	images := make([]corev1.ContainerImage, 40)
	for i := range images {
		images[i] = corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.example/team/image-%d@sha256:%064x", i, i)}, SizeBytes: int64(i) << 20}
	}
	taints := []corev1.Taint{{Key: "cni.istio.io/not-ready", Effect: corev1.TaintEffectNoSchedule}, {Key: "pool", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	full := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "1b2c", ResourceVersion: "77",
			Labels:        map[string]string{"kubernetes.io/os": "linux", "pool": "gpu"},
			Annotations:   map[string]string{"node.alpha.kubernetes.io/ttl": "0", "csi.volume.kubernetes.io/nodeid": `{"ebs.csi.aws.com":"i-0abc"}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: corev1.NodeSpec{PodCIDR: "10.64.0.0/24", Taints: taints},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
			Images:     images,
		},
	}
	trimmedObj, err := informer.TrimNode(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	trimmed := trimmedObj.(*corev1.Node)
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "1b2c", ResourceVersion: "77", Labels: full.Labels},
		Spec:       full.Spec,
	}
	if diff := cmp.Diff(want, trimmed); diff != "" {
		t.Errorf("trimmed Node (-want +got):\n%s", diff)
	}
	// The DaemonSet decision reads the same from both.
	spec := &corev1.PodSpec{
		NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}},
		}}},
	}
	if got, wantWhy := daemonset.Excludes(spec, trimmed, false, "cni.istio.io/not-ready"), daemonset.Excludes(spec, full, false, "cni.istio.io/not-ready"); got != wantWhy || !strings.Contains(got, "pool=gpu") {
		t.Errorf("Excludes says %q of the trimmed Node, %q of the full one; want the same, the untolerated pool taint", got, wantWhy)
	}
	other := spec.DeepCopy()
	other.NodeSelector["pool"] = "cpu"
	if got, wantWhy := daemonset.Excludes(other, trimmed, true, "cni.istio.io/not-ready"), daemonset.Excludes(other, full, true, "cni.istio.io/not-ready"); got != wantWhy || !strings.Contains(got, "node selector") {
		t.Errorf("Excludes says %q of the trimmed Node, %q of the full one; want the same, the node selector's mismatch", got, wantWhy)
	}
	if b, a := full.Size(), trimmed.Size(); a*5 > b {
		t.Errorf("the trimmed Node is %d bytes in protobuf of the full one's %d: want at most a fifth", a, b)
	}
}
