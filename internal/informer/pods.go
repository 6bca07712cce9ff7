package informer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// NodePods is the informer of one node's pods that the agent's pod cache and repair
// controller share: one list and one watch of the node's pods per agent, and one copy
// of them in memory, however many parts read them. Its owner runs it, once (client-go
// allows one Run per informer); the parts only add handlers and read its store.
type NodePods struct {
	// Node is the node whose pods it holds: the watch's spec.nodeName.
	Node     string
	Informer cache.SharedIndexInformer
}

// NewNodePods builds the informer of node's pods, trimmed by TrimPod, indexed by
// namespace. It starts nothing.
func NewNodePods(client corev1client.PodsGetter, node string) *NodePods {
	return &NodePods{Node: node, Informer: Pods(client, Selector{Field: NodeField(node)})}
}

// Run runs the informer until ctx ends.
func (p *NodePods) Run(ctx context.Context) { p.Informer.RunWithContext(ctx) }

// NodeField is the field selector of node's pods.
func NodeField(node string) string {
	return fields.OneTermEqualSelector("spec.nodeName", node).String()
}

// Pods is an informer of the pods sel selects, in every namespace, trimmed by
// TrimPod, indexed by namespace.
func Pods(client corev1client.PodsGetter, sel Selector) cache.SharedIndexInformer {
	api := client.Pods(corev1.NamespaceAll)
	inf := New(&corev1.Pod{}, sel, api.List, api.Watch)
	// SetTransform fails only on an informer already started.
	_ = inf.SetTransform(TrimPod)
	return inf
}

// TrimPod drops what no reader of the node's pods uses: managed fields (often the
// largest part of a pod object) and status conditions. The pod cache serves the
// plugin, which reads metadata, spec and the status' phase and addresses; the repair
// controller reads metadata, spec, the init containers' statuses and the addresses.
func TrimPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
		p.Status.Conditions = nil
	}
	return obj, nil
}

// TrimNode drops what the taint controller, the only reader of Nodes, never uses:
// the status (its list of the node's images alone is often 10-20 KiB), annotations
// and managed fields, most of a Node object. It keeps the name, uid and
// resourceVersion (the taint patch's precondition), the labels (a DaemonSet's node
// selector and affinity) and the spec (the taints). The leader caches every Node
// of the cluster: 21 KiB a Node untrimmed in the scale simulation, about 105 MiB
// at 5,000 nodes.
func TrimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Annotations = nil
		n.Status = corev1.NodeStatus{}
	}
	return obj, nil
}
