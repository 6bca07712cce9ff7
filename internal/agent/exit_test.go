package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// fakeExit answers the exit decision's reads from fixed objects or errors.
// The decision's contract with the real API server is tested in
// exit_controlplane_test.go; this table covers every branch.
type fakeExit struct {
	pod                       *corev1.Pod
	ds                        *appsv1.DaemonSet
	node                      *corev1.Node
	others                    []appsv1.DaemonSet // the namespace's DaemonSets, listed
	podErr, dsErr, nodeErr    error
	listErr                   error
	podReads, dsReads, nReads int
}

func (f *fakeExit) getPod(context.Context, string, string) (*corev1.Pod, error) {
	f.podReads++
	return f.pod, f.podErr
}

func (f *fakeExit) getDaemonSet(context.Context, string, string) (*appsv1.DaemonSet, error) {
	f.dsReads++
	return f.ds, f.dsErr
}

func (f *fakeExit) getNode(context.Context, string) (*corev1.Node, error) {
	f.nReads++
	return f.node, f.nodeErr
}

func (f *fakeExit) listDaemonSets(context.Context, string) ([]appsv1.DaemonSet, error) {
	return f.others, f.listErr
}

func TestExitTellsARestartFromARemoval(t *testing.T) {
	dsRef := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "istio-cni-node", Controller: ptr.To(true)}
	agentPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node-x", OwnerReferences: []metav1.OwnerReference{*dsRef}}}
	daemonSet := func(mod func(*corev1.PodSpec)) *appsv1.DaemonSet {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node"}}
		ds.Spec.Template.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "linux"}
		if mod != nil {
			mod(&ds.Spec.Template.Spec)
		}
		return ds
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"kubernetes.io/os": "linux", "pool": "mesh"}}}
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	known := owner{known: true, daemonSet: dsRef}
	deleting := daemonSet(nil)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: "drain", Value: "now", Effect: corev1.TaintEffectNoExecute}}
	withTaint := func(key, value string, effect corev1.TaintEffect) *corev1.Node {
		n := node.DeepCopy()
		n.Spec.Taints = []corev1.Taint{{Key: key, Value: value, Effect: effect}}
		return n
	}

	// main is another DaemonSet of the agent in the namespace: the one a canary
	// DaemonSet, this agent's, runs beside.
	main := func(mod func(*appsv1.DaemonSet)) []appsv1.DaemonSet {
		ds := daemonSet(nil)
		ds.Name, ds.Namespace = "istio-cni-node-main", "kube-system"
		ds.Spec.Template.Labels = map[string]string{"k8s-app": "istio-cni-node"}
		if mod != nil {
			mod(ds)
		}
		return []appsv1.DaemonSet{*ds}
	}
	notFound := apierrors.NewNotFound(gr, "istio-cni-node")

	unauthorized := apierrors.NewUnauthorized("invalid token")
	// pluginSays is the plugin's credential answering err (nil: the pod).
	pluginSays := func(err error) pluginIdentity { return func(context.Context) error { return err } }
	cases := []struct {
		name      string
		o         owner
		f         fakeExit
		plugin    pluginIdentity // nil: no PLUGIN_SERVICE_ACCOUNT
		uninstall bool
		reason    string
	}{
		{"rolling update, crash, eviction: the DaemonSet still fits the node", known,
			fakeExit{ds: daemonSet(nil), node: node}, nil, false, "still runs on node node-a"},
		{"owner learnt at exit when it was not at start", owner{},
			fakeExit{pod: agentPod, ds: daemonSet(nil), node: node}, nil, false, "still runs on node node-a"},
		{"helm uninstall: the DaemonSet is gone", known,
			fakeExit{dsErr: apierrors.NewNotFound(gr, "istio-cni-node")}, nil, true, "is deleted"},
		{"kubectl delete with foreground deletion: the DaemonSet is being deleted", known,
			fakeExit{ds: deleting}, nil, true, "being deleted"},
		{"helm uninstall deleted the ServiceAccount first; the plugin uses the agent's token", known,
			fakeExit{dsErr: unauthorized}, nil, true, "refuses this agent's identity"},
		{"helm uninstall deleted both ServiceAccounts", known,
			fakeExit{dsErr: unauthorized}, pluginSays(unauthorized), true, "and the plugin's (HTTP 401"},
		{"helm uninstall deleted the grants, then the agent's ServiceAccount", known,
			fakeExit{dsErr: unauthorized}, pluginSays(apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", nil)), true, "and the plugin's (HTTP 403"},
		{"the agent's pod force-deleted (its token with it), the chart installed", known,
			fakeExit{dsErr: unauthorized}, pluginSays(apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "istio-cni-node-x")), false,
			"not the plugin's (HTTP 404"},
		{"the agent's token refused, owner unknown, the plugin reads the pod", owner{},
			fakeExit{podErr: unauthorized}, pluginSays(nil), false, "not the plugin's (HTTP 200)"},
		{"the agent's token refused on the node, the plugin's accepted", known,
			fakeExit{ds: daemonSet(nil), nodeErr: unauthorized}, pluginSays(apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "x")), false,
			"keeping the plugin installed"},
		{"the agent's token refused, no plugin kubeconfig to ask with", known,
			fakeExit{dsErr: unauthorized}, pluginSays(fmt.Errorf("%w: open istio-cni-kubeconfig: no such file", errNoPluginIdentity)), true,
			"none other to ask with"},
		{"the agent's token refused, the plugin's request times out", known,
			fakeExit{dsErr: unauthorized}, pluginSays(context.DeadlineExceeded), false, "asking with the plugin's failed"},
		{"helm uninstall deleted the RBAC first", owner{},
			fakeExit{podErr: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", nil)},
			func(context.Context) error { panic("a 403 is not asked again") }, true,
			"forbids this agent to get pods istio-cni-node-x in namespace kube-system (HTTP 403 Forbidden): taken for helm uninstall"},
		{"the agent's DaemonSet may not be read (helm uninstall, or a grant missing)", known,
			fakeExit{dsErr: apierrors.NewForbidden(gr, "istio-cni-node", nil)}, pluginSays(nil), true,
			"forbids this agent to get daemonsets.apps istio-cni-node in namespace kube-system (HTTP 403 Forbidden)"},
		{"the node may not be read", known,
			fakeExit{ds: daemonSet(nil), nodeErr: apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "node-a", nil)}, nil, true,
			"forbids this agent to get nodes node-a (HTTP 403 Forbidden)"},
		{"the node selector no longer matches", known,
			fakeExit{ds: daemonSet(func(s *corev1.PodSpec) { s.NodeSelector["pool"] = "other" }), node: node}, nil, true, "node selector"},
		{"required node affinity no longer matches", known,
			fakeExit{ds: daemonSet(func(s *corev1.PodSpec) {
				s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"mesh"}}}}}}}}
			}), node: node}, nil, true, "affinity"},
		{"a NoExecute taint the DaemonSet does not tolerate", known,
			fakeExit{ds: daemonSet(nil), node: tainted}, nil, true, "drain=now"},
		{"a NoExecute taint the DaemonSet tolerates", known,
			fakeExit{ds: daemonSet(func(s *corev1.PodSpec) { s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}} }), node: tainted}, nil, false, "still runs"},
		{"cordoned: every DaemonSet pod tolerates node.kubernetes.io/unschedulable", known,
			fakeExit{ds: daemonSet(nil), node: withTaint(corev1.TaintNodeUnschedulable, "", corev1.TaintEffectNoSchedule)}, nil, false, "still runs"},
		// No new agent is placed there, but a container restart (liveness) keeps
		// this pod: uninstalling would let pods start uncaptured meanwhile.
		{"a NoSchedule taint the DaemonSet does not tolerate keeps the running agent's install", known,
			fakeExit{ds: daemonSet(nil), node: withTaint("dedicated", "gpu", corev1.TaintEffectNoSchedule)}, nil, false, "still runs"},
		{"a NoSchedule taint the DaemonSet tolerates", known,
			fakeExit{ds: daemonSet(func(s *corev1.PodSpec) {
				s.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
			}),
				node: withTaint("dedicated", "gpu", corev1.TaintEffectNoSchedule)}, nil, false, "still runs"},
		{"the node readiness taint never counts", known,
			fakeExit{ds: daemonSet(nil), node: withTaint("cni.istio.io/not-ready", "true", corev1.TaintEffectNoSchedule)}, nil, false, "still runs"},
		{"the node is deleted", known,
			fakeExit{ds: daemonSet(nil), nodeErr: apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "node-a")}, nil, true, "node node-a is deleted"},
		{"not run by a DaemonSet", owner{known: true},
			fakeExit{node: node}, nil, true, "not run by a DaemonSet"},
		{"a canary DaemonSet deleted while the main one runs on the node", known,
			fakeExit{dsErr: notFound, node: node, others: main(nil)}, nil, false,
			"is deleted, but DaemonSet kube-system/istio-cni-node-main still runs an agent on node node-a"},
		{"a canary DaemonSet being deleted while the main one runs on the node", known,
			fakeExit{ds: deleting, node: node, others: main(nil)}, nil, false, "istio-cni-node-main still runs"},
		{"a canary DaemonSet no longer selecting the node while the main one runs there", known,
			fakeExit{ds: daemonSet(func(s *corev1.PodSpec) { s.NodeSelector["pool"] = "other" }), node: node, others: main(nil)}, nil, false,
			"istio-cni-node-main still runs"},
		{"not run by a DaemonSet, beside the DaemonSet's agent", owner{known: true},
			fakeExit{node: node, others: main(nil)}, nil, false, "istio-cni-node-main still runs"},
		{"the other DaemonSet of the agent does not run on the node", known,
			fakeExit{dsErr: notFound, node: node, others: main(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["pool"] = "other" })}, nil, true,
			"is deleted"},
		{"the other DaemonSet of the agent is being deleted too", known,
			fakeExit{dsErr: notFound, node: node, others: main(func(ds *appsv1.DaemonSet) { ds.DeletionTimestamp = ptr.To(metav1.Now()) })}, nil, true,
			"is deleted"},
		{"the other DaemonSet is not the agent's", known,
			fakeExit{dsErr: notFound, node: node, others: main(func(ds *appsv1.DaemonSet) { ds.Spec.Template.Labels = map[string]string{"app": "other"} })}, nil, true,
			"is deleted"},
		{"listing the DaemonSets is no longer granted (helm uninstall)", known,
			fakeExit{dsErr: notFound, node: node, listErr: apierrors.NewForbidden(gr, "", nil)}, nil, true,
			"is deleted; the API server forbids this agent to list daemonsets.apps in namespace kube-system (HTTP 403 Forbidden)"},
		{"listing the DaemonSets with a refused identity", known,
			fakeExit{dsErr: notFound, node: node, listErr: unauthorized}, pluginSays(nil), true,
			"is deleted; the API server refuses this agent's identity (HTTP 401 Unauthorized) to list"},
		{"listing the DaemonSets times out: keep", known,
			fakeExit{dsErr: notFound, node: node, listErr: context.DeadlineExceeded}, nil, false, "listing the DaemonSets of kube-system failed"},
		{"API server down: keep", known,
			fakeExit{dsErr: context.DeadlineExceeded}, nil, false, "keeping the plugin installed"},
		{"API server failing: keep", owner{},
			fakeExit{podErr: apierrors.NewInternalError(context.Canceled)}, nil, false, "HTTP 500"},
		{"pod gone and owner unknown: keep", owner{},
			fakeExit{podErr: apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "istio-cni-node-x")}, nil, false, "keeping"},
		{"node unreadable: keep", known,
			fakeExit{ds: daemonSet(nil), nodeErr: apierrors.NewServiceUnavailable("etcd")}, nil, false, "cannot read node node-a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := decideExit(context.Background(), &tc.f, tc.plugin, tc.o, "kube-system", "istio-cni-node-x", "node-a", "cni.istio.io/not-ready", "k8s-app=istio-cni-node")
			if got.Uninstall != tc.uninstall || !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("decideExit = %+v, want uninstall=%v and a reason with %q", got, tc.uninstall, tc.reason)
			}
			if tc.o.known && tc.f.podReads != 0 {
				t.Errorf("read the agent's pod again although its owner was known")
			}
		})
	}
}

// TestTheFeaturesStopWithinTheExitDecisionsBound: the exit decision's requests are
// made while the features stop, and the uninstall waits for both: ExitBound holds
// only while the features take no longer than the decision.
func TestTheFeaturesStopWithinTheExitDecisionsBound(t *testing.T) {
	if controllerStopWait > ExitLookupBound {
		t.Errorf("controllerStopWait %s > ExitLookupBound %s: the exit can wait longer than ExitBound (%s)", controllerStopWait, ExitLookupBound, ExitBound)
	}
}
