package chart

import (
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// valuesFile writes values as a values file and returns the helm arguments that pass it.
func valuesFile(t *testing.T, values map[string]any) []string {
	t.Helper()
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	// Not under t.TempDir: a test name may hold a comma, and helm splits -f at commas.
	f, err := os.CreateTemp("", "values-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return []string{"-f", f.Name()}
}

// TestTaintIsRefusedUnlessTheAgentToleratesIt: with the taint on, the chart renders
// exactly when some toleration lets the agent back onto a node it tainted, as Kubernetes
// matches tolerations; otherwise it refuses, naming the taint. (NoExecute, which
// tolerationSeconds would make a question of time, is refused by the schema.)
func TestTaintIsRefusedUnlessTheAgentToleratesIt(t *testing.T) {
	seconds := int64(60)
	cases := []struct {
		name        string
		key, effect string
		tolerations []corev1.Toleration
	}{
		{"the default: everything", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
		{"none", "cni.istio.io/not-ready", "NoSchedule", nil},
		{"every key, the taint's effect", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}},
		{"every key, another effect", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}},
		{"the key, Exists", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Key: "cni.istio.io/not-ready", Operator: corev1.TolerationOpExists}}},
		{"the key, Equal true", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Key: "cni.istio.io/not-ready", Operator: corev1.TolerationOpEqual, Value: "true"}}},
		{"the key, no operator (Equal) and true", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Key: "cni.istio.io/not-ready", Value: "true"}}},
		{"the key, Equal another value", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Key: "cni.istio.io/not-ready", Operator: corev1.TolerationOpEqual, Value: "false"}}},
		{"another key", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}}},
		{"Istio's defaults", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{
			{Effect: corev1.TaintEffectNoSchedule, Operator: corev1.TolerationOpExists},
			{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
			{Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists}}},
		{"own key and effect, tolerated", "example.com/cni", "PreferNoSchedule", []corev1.Toleration{{Key: "example.com/cni", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule}}},
		{"own key and effect, other effect", "example.com/cni", "PreferNoSchedule", []corev1.Toleration{{Key: "example.com/cni", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}},
		{"NoSchedule with tolerationSeconds", "cni.istio.io/not-ready", "NoSchedule", []corev1.Toleration{{Operator: corev1.TolerationOpExists, TolerationSeconds: &seconds}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			taint := corev1.Taint{Key: c.key, Value: "true", Effect: corev1.TaintEffect(c.effect)}
			want := false
			for _, tol := range c.tolerations {
				if tolerates([]corev1.Toleration{tol}, taint) {
					want = true
				}
			}
			args := valuesFile(t, map[string]any{
				"taint":       map[string]any{"enabled": true, "key": c.key, "effect": c.effect},
				"tolerations": c.tolerations,
			})
			m, err := render(t, args...)
			switch {
			case want && err != nil:
				t.Fatalf("refused although the agent tolerates %s: %v", taint.ToString(), err)
			case want:
				if got := m.daemonSet(t).Spec.Template.Spec.Tolerations; !tolerates(got, taint) {
					t.Errorf("the rendered tolerations %+v do not tolerate %s", got, taint.ToString())
				}
			case err == nil:
				t.Fatalf("rendered although the agent could not come back onto a node tainted %s", taint.ToString())
			default:
				wantRefused(t, args, []string{"taint.enabled is true", "tolerations", fmt.Sprintf("%s=true:%s", c.key, c.effect)})
			}
		})
	}
}

// TestTaintedNodesAreTheDaemonSetsNodes: the taint controller's node selector
// (TAINT_NODE_LABEL_SELECTOR) takes exactly the nodes the DaemonSet schedules agents on,
// by nodeSelector and by the required node affinity, as the scheduler matches them: a
// node it took beyond them would be tainted with no agent to untaint it.
func TestTaintedNodesAreTheDaemonSetsNodes(t *testing.T) {
	nodes := []map[string]string{
		{},
		{"kubernetes.io/os": "linux"},
		{"kubernetes.io/os": "windows"},
		{"kubernetes.io/os": "linux", "example.com/no-mesh": ""},
		{"kubernetes.io/os": "linux", "example.com/pool": "mesh"},
		{"kubernetes.io/os": "linux", "example.com/pool": "batch"},
		{"kubernetes.io/os": "linux", "example.com/pool": "edge", "example.com/gen": "3"},
		{"kubernetes.io/os": "linux", "example.com/gen": "7"},
		{"kubernetes.io/os": "linux", "example.com/gen": "1", "example.com/no-mesh": "true"},
		{"kubernetes.io/os": "linux", "eks.amazonaws.com/compute-type": "fargate"},
		{"kubernetes.io/os": "linux", "eks.amazonaws.com/compute-type": "ec2"},
		{"kubernetes.io/os": "linux", "type": "virtual-kubelet"},
	}
	expr := func(key, op string, values ...string) map[string]any {
		e := map[string]any{"key": key, "operator": op}
		if values != nil {
			e["values"] = values
		}
		return e
	}
	required := func(exprs ...map[string]any) map[string]any {
		return map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": exprs}}}}}
	}
	cases := []struct {
		name   string
		values map[string]any
	}{
		{"nodeSelector only", nil},
		{"no nodeSelector, DoesNotExist", map[string]any{"nodeSelector": nil, "affinity": required(expr("example.com/no-mesh", "DoesNotExist"))}},
		{"In", map[string]any{"affinity": required(expr("example.com/pool", "In", "mesh", "edge"))}},
		{"NotIn", map[string]any{"affinity": required(expr("example.com/pool", "NotIn", "batch"))}},
		{"Exists", map[string]any{"affinity": required(expr("example.com/gen", "Exists"))}},
		{"Gt and Lt", map[string]any{"affinity": required(expr("example.com/gen", "Gt", "2"), expr("example.com/gen", "Lt", "5"))}},
		{"several with a nodeSelector", map[string]any{"nodeSelector": map[string]string{"kubernetes.io/os": "linux"},
			"affinity": required(expr("example.com/no-mesh", "DoesNotExist"), expr("example.com/pool", "NotIn", "batch"))}},
		{"preferred terms exclude no node", map[string]any{"affinity": map[string]any{"nodeAffinity": map[string]any{
			"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": 1,
				"preference": map[string]any{"matchExpressions": []any{expr("example.com/pool", "In", "mesh")}}}}}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			values := map[string]any{"taint": map[string]any{"enabled": true}}
			for k, v := range c.values {
				values[k] = v
			}
			m := mustRender(t, valuesFile(t, values)...)
			text := m.env(t)["TAINT_NODE_LABEL_SELECTOR"] // unset: every node
			selector, err := labels.Parse(text)
			if err != nil {
				t.Fatalf("TAINT_NODE_LABEL_SELECTOR %q is not a label selector: %v", text, err)
			}
			pod := &corev1.Pod{Spec: m.daemonSet(t).Spec.Template.Spec}
			for _, l := range nodes {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: l}}
				scheduled, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
				if err != nil {
					t.Fatalf("the DaemonSet's node affinity: %v", err)
				}
				if tainted := selector.Matches(labels.Set(l)); tainted != scheduled {
					t.Errorf("node %v: tainted by %q: %v, gets an agent: %v", l, text, tainted, scheduled)
				}
			}
		})
	}
}

// TestTaintNodeAffinityNoLabelSelectorSays: a required node affinity that one label
// selector cannot express (either of two terms, node names) renders with the taint on,
// the selector holding only what it can say (the controller checks each node against
// the DaemonSet's own placement); a term that matches no node is refused.
func TestTaintNodeAffinityNoLabelSelectorSays(t *testing.T) {
	term := func(key string) map[string]any {
		return map[string]any{"matchExpressions": []any{map[string]any{"key": key, "operator": "Exists"}}}
	}
	nodeAffinity := func(terms ...any) map[string]any {
		return map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": terms}}}
	}
	for _, c := range []struct {
		name     string
		affinity map[string]any
	}{
		{"either of two terms", nodeAffinity(term("a.example.com/mesh"), term("b.example.com/mesh"))},
		{"node names", nodeAffinity(map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []string{"node-1"}}}})},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, valuesFile(t, map[string]any{"taint": map[string]any{"enabled": true}, "affinity": c.affinity})...)
			if got := envOf("TAINT_NODE_LABEL_SELECTOR")(t, m); got != "kubernetes.io/os=linux" {
				t.Errorf("TAINT_NODE_LABEL_SELECTOR = %v, want only the nodeSelector's kubernetes.io/os=linux", got)
			}
		})
	}
	wantRefused(t, valuesFile(t, map[string]any{"taint": map[string]any{"enabled": true}, "affinity": nodeAffinity(map[string]any{})}),
		[]string{"taint.enabled is true", "affinity.nodeAffinity", "matches no node"})
}

// TestVirtualNodesGetNoAgentByDefault: with no affinity of the user's, the agent
// pods leave out EKS Fargate's and virtual-kubelet's nodes (AKS virtual nodes), where
// no DaemonSet pod ever starts: the default tolerations tolerate their taints, so
// the DaemonSet put a pod there that held a rolling update's maxUnavailable for
// ever. Every other node still gets one, and an affinity of the user's replaces the
// default.
func TestVirtualNodesGetNoAgentByDefault(t *testing.T) {
	node := func(l map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: l}}
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		labels map[string]string
		want   bool
	}{
		{"a plain node", nil, map[string]string{"kubernetes.io/os": "linux"}, true},
		{"an EKS EC2 node", nil, map[string]string{"kubernetes.io/os": "linux", "eks.amazonaws.com/compute-type": "ec2"}, true},
		{"an EKS Fargate node", nil, map[string]string{"kubernetes.io/os": "linux", "eks.amazonaws.com/compute-type": "fargate"}, false},
		{"a virtual-kubelet node", nil, map[string]string{"kubernetes.io/os": "linux", "type": "virtual-kubelet"}, false},
		{"the user's affinity replaces the default", map[string]any{"affinity": map[string]any{"nodeAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{map[string]any{
				"matchExpressions": []any{map[string]any{"key": "example.com/pool", "operator": "NotIn", "values": []string{"batch"}}}}}}}}},
			map[string]string{"kubernetes.io/os": "linux", "type": "virtual-kubelet"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, valuesFile(t, tc.values)...)
			pod := &corev1.Pod{Spec: m.daemonSet(t).Spec.Template.Spec}
			got, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node(tc.labels))
			if err != nil {
				t.Fatalf("the DaemonSet's node affinity: %v", err)
			}
			if got != tc.want {
				t.Errorf("node %v gets an agent: %v, want %v", tc.labels, got, tc.want)
			}
		})
	}
}
