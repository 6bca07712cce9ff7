package taint

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/istio-cni/istio-cni/internal/apibound"
	"github.com/istio-cni/istio-cni/internal/daemonset"
	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/lease"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// Metrics are the controller's counters, plain atomics for the agent to export.
type Metrics struct {
	// TaintsAdded and TaintsRemoved count successful node patches.
	TaintsAdded   atomic.Uint64
	TaintsRemoved atomic.Uint64
	// PatchFailures counts node patches that failed (and were retried).
	PatchFailures atomic.Uint64
	lease.Leadership
}

// Client is the part of the API the controller uses: nodes and pods, the agent's
// DaemonSets, and the lease. A kubernetes.Interface clientset satisfies it; the
// agent passes clients of these three groups alone, so that its binary does not
// link a client for every API group.
type Client interface {
	CoreV1() corev1client.CoreV1Interface
	AppsV1() appsv1client.AppsV1Interface
	CoordinationV1() coordinationv1client.CoordinationV1Interface
}

// Deps are optional.
type Deps struct {
	Logger  *slog.Logger
	Metrics *Metrics
	// APITimeout bounds each call of a worker to the API server; 0: APITimeout.
	APITimeout time.Duration
}

// Controller keeps the readiness taint on exactly the nodes that a DaemonSet of
// the agent runs on and whose agent pod is not Ready (see reconcile), while it
// holds the lease.
type Controller struct {
	cfg     Config
	client  Client
	log     *slog.Logger
	metrics *Metrics
	// apiTimeout bounds each call of a worker to the API server (Deps.APITimeout).
	apiTimeout time.Duration
}

// New checks cfg; it starts nothing.
func New(cfg Config, client Client, deps Deps) (*Controller, error) {
	if err := settings.CheckEnabled("taint controller", EnvEnabled, cfg.Enabled, cfg.Validate); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("taint controller: no Kubernetes client")
	}
	c := &Controller{cfg: cfg, client: client, log: deps.Logger, metrics: deps.Metrics,
		apiTimeout: cmp.Or(deps.APITimeout, APITimeout)}
	c.log = cmp.Or(c.log, slog.Default()).With("controller", "taint", "identity", cfg.Identity)
	if c.metrics == nil {
		c.metrics = &Metrics{}
	}
	return c, nil
}

// Metrics returns the controller's counters.
func (c *Controller) Metrics() *Metrics { return c.metrics }

// Run campaigns for the lease until ctx ends, and while leading keeps the taints
// right. Losing the lease stops all work (watches included) and campaigns again.
// The lease is released when ctx ends, so another replica takes over at once.
func (c *Controller) Run(ctx context.Context) error {
	return lease.RunJob(ctx, c.client.CoordinationV1(), c.cfg.AgentNamespace, c.cfg.Config, &c.metrics.Leadership, c.log, lease.Job{
		Name: "taint controller", Leading: "leading: keeping node readiness taints", LeadingArgs: []any{"taint", c.cfg.Key + ":" + string(c.cfg.Effect)}, Lead: c.lead,
	})
}

const nodeIndex = "spec.nodeName"

// lead runs the informers and workers until ctx ends (the lease is lost or Run's
// context ends). A fresh cache per leadership: a standby replica holds none. Once
// the caches have synced, and before the workers start, the Lease records the
// taint key (recordKey); the taints of earlier keys it recorded are lifted beside
// the workers (liftEarlier).
func (c *Controller) lead(ctx context.Context) error {
	nodeAPI, podAPI := c.client.CoreV1().Nodes(), c.client.CoreV1().Pods(c.cfg.AgentNamespace)
	dsAPI := c.client.AppsV1().DaemonSets(c.cfg.AgentNamespace)
	nodes := informer.New(&corev1.Node{}, informer.Selector{Label: c.cfg.NodeSelector}, nodeAPI.List, nodeAPI.Watch)
	// Fails only on an informer already started.
	_ = nodes.SetTransform(informer.TrimNode)
	pods := informer.New(&corev1.Pod{}, informer.Selector{Label: c.cfg.AgentSelector}, podAPI.List, podAPI.Watch)
	// Every DaemonSet of the namespace: RBAC cannot restrict a watch to those whose
	// pod template carries the agent's labels; agentDaemonSets filters them.
	daemonSets := informer.New(&appsv1.DaemonSet{}, informer.Selector{}, dsAPI.List, dsAPI.Watch)
	if err := pods.AddIndexers(cache.Indexers{nodeIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	agentSelector, err := labels.Parse(c.cfg.AgentSelector)
	if err != nil {
		return fmt.Errorf("%s %q: %w", EnvAgentSelector, c.cfg.AgentSelector, err)
	}
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "taint"})
	defer queue.ShutDown()
	r := &reconciler{c: c, nodes: nodes.GetIndexer(), pods: pods.GetIndexer(), daemonSets: daemonSets.GetIndexer(),
		agentSelector: agentSelector, left: map[string]bool{}, handover: map[string]bool{}}
	enqueueNode := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			queue.Add(n.Name)
		}
	}
	// A node leaves the cache when it is deleted, or when it stops matching
	// TAINT_NODE_LABEL_SELECTOR (the API server reports that as a deletion): the
	// latter keeps a taint that nobody would remove otherwise.
	nodeLeft := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if n, ok := obj.(*corev1.Node); ok {
			r.markLeft(n.Name)
			queue.Add(n.Name)
		}
	}
	enqueuePodNode := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			queue.Add(p.Spec.NodeName)
		}
	}
	// A DaemonSet added, deleted, or whose placement may have changed (its spec,
	// its deletion) changes which nodes need an agent: all are looked at again, from
	// the cache. Status updates (every rollout step) are not.
	enqueueAllNodes := func() {
		for _, name := range nodes.GetIndexer().ListKeys() {
			queue.Add(name)
		}
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueNode, UpdateFunc: func(_, n any) { enqueueNode(n) }, DeleteFunc: nodeLeft,
	}); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueuePodNode, UpdateFunc: func(o, n any) { enqueuePodNode(o); enqueuePodNode(n) }, DeleteFunc: enqueuePodNode,
	}); err != nil {
		return err
	}
	if _, err := daemonSets.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { enqueueAllNodes() },
		UpdateFunc: func(o, n any) {
			od, ok1 := o.(*appsv1.DaemonSet)
			nd, ok2 := n.(*appsv1.DaemonSet)
			if !ok1 || !ok2 || od.Generation != nd.Generation || (od.DeletionTimestamp == nil) != (nd.DeletionTimestamp == nil) {
				enqueueAllNodes()
			}
		},
		DeleteFunc: func(any) { enqueueAllNodes() },
	}); err != nil {
		return err
	}
	// lead returns only once the informers have stopped: the next leadership starts
	// from fresh caches, and a lost lease leaves no watch open.
	var informers sync.WaitGroup
	informers.Go(func() { nodes.RunWithContext(ctx) })
	informers.Go(func() { pods.RunWithContext(ctx) })
	informers.Go(func() { daemonSets.RunWithContext(ctx) })
	defer informers.Wait()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, pods.HasSynced, daemonSets.HasSynced) {
		// The term ended (the agent stops, the lease is lost) before the caches
		// synced: nothing failed, and a term's error is logged as a failure.
		return nil
	}
	earlier, held := c.recordKey(ctx)
	if !held {
		return nil
	}
	r.earlier = earlier
	var lifting sync.WaitGroup
	if len(earlier) > 0 {
		lifting.Go(func() { r.liftEarlier(ctx) })
	}
	defer lifting.Wait()
	informer.Work(ctx, queue, 2, r.reconcile, func(name string, err error, repeated bool) {
		if err == nil {
			c.log.Info("node taint up to date again", "node", name, "taint", c.cfg.Key)
			return
		}
		c.metrics.PatchFailures.Add(1)
		if !repeated {
			c.log.Warn("node taint not updated, retrying (logged again when the error changes)", "node", name, "taint", c.cfg.Key, "error", err)
		}
	})
	return nil
}

type reconciler struct {
	c             *Controller
	nodes         cache.Indexer
	pods          cache.Indexer
	daemonSets    cache.Indexer
	agentSelector labels.Selector
	// earlier are the taint keys of earlier leaders still to be lifted (recordKey),
	// set before the workers start.
	earlier []string

	mu sync.Mutex
	// left holds the nodes that left the node cache since they were last looked at:
	// deleted, or no longer matching TAINT_NODE_LABEL_SELECTOR.
	left map[string]bool
	// handover holds the nodes where an agent pod was seen terminating and no agent
	// has been Ready since: a rolling update, an eviction or a removal, during which
	// the plugin stays installed (or the exiting agent removes the taint itself), so
	// the taint is not added. It lasts one leadership: a new leader that sees the new
	// agent starting without having seen the old one go taints the node until it is
	// Ready, as after a crash.
	handover map[string]bool
}

func (r *reconciler) markLeft(node string) {
	r.mu.Lock()
	r.left[node] = true
	r.mu.Unlock()
}

// takeLeft reports (and forgets) that node left the cache, and forgets its
// handover with it: a node of the same name that joins later (EKS names nodes by
// their IP) is a new node whose first agent is starting, and the memory of every
// node removed in the middle of a handover would otherwise last the leadership.
func (r *reconciler) takeLeft(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	left := r.left[node]
	delete(r.left, node)
	delete(r.handover, node)
	return left
}

// agentState: an agent pod on the node is Ready and not being deleted (ready), one
// is on the node, not being deleted and not ended (running: the DaemonSet
// controller keeps it where it would place no new one, see daemonset.Excludes),
// one is being deleted (terminating), and one is not Ready by the node lifecycle
// controller's mark rather than by its kubelet's report (unknown, see
// markedNotReady).
func (r *reconciler) agentState(node string) (ready, running, terminating, unknown bool) {
	objs, _ := r.pods.ByIndex(nodeIndex, node)
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil {
			terminating = true
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		running = true
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
			if markedNotReady(cond) {
				unknown = true
			}
		}
	}
	return ready, running, terminating, unknown
}

// markedNotReady reports whether a pod's condition is the node lifecycle
// controller's mark, not its kubelet's report. When a node stops reporting (a
// network partition, an API server its kubelet cannot reach, or one too loaded
// by every client's relist to take the kubelets' updates in time as it recovers
// from an outage), kube-controller-manager turns every Ready pod of the node not
// Ready: it flips the status of the Ready condition and keeps its reason, which
// is empty on a Ready pod. The kubelet gives every Ready condition that is not
// True a reason (ContainersNotReady, ReadinessGatesNotReady, PodCompleted,
// UnknownContainerStatuses). An agent so marked was Ready when its node went
// silent, and nobody knows whether it still is: its kubelet reports again once
// it can.
func markedNotReady(cond corev1.PodCondition) bool {
	return cond.Type == corev1.PodReady && cond.Status == corev1.ConditionFalse && cond.Reason == ""
}

// agentDaemonSet names a DaemonSet of the agent (its pod template carries the
// agent's labels), not being deleted, that runs a pod on node; "" when none does.
// running (an agent pod is on the node, see agentState): whether it keeps that
// one, else whether it places one there, which a NoSchedule taint it does not
// tolerate prevents. The latter is the exit decision's question
// (daemonset.Excludes): no DaemonSet places an agent on the node, and an exiting
// agent uninstalls the plugin there. The readiness taint itself never counts.
func (r *reconciler) agentDaemonSet(node *corev1.Node, running bool) string {
	objs := r.daemonSets.List()
	sets := make([]*appsv1.DaemonSet, 0, len(objs))
	for _, o := range objs {
		sets = append(sets, o.(*appsv1.DaemonSet))
	}
	if len(r.earlier) > 0 {
		// An earlier key's taint is lifted (liftEarlier), and the DaemonSet
		// controller places the agent once it is gone: it counts no more than
		// this key's own.
		n := *node
		n.Spec.Taints = slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return slices.Contains(r.earlier, t.Key) })
		node = &n
	}
	return daemonset.AgentOn(sets, r.agentSelector, node, running, r.c.cfg.Key)
}

// handingOver updates and reports the node's handover (see reconciler.handover).
// A node no DaemonSet of the agent runs on (targeted false) has none: its agent
// leaves for good and uninstalls the plugin, so the next agent there, should the
// node be targeted again, is a first install.
func (r *reconciler) handingOver(node string, targeted, ready, terminating bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case ready || !targeted:
		delete(r.handover, node)
	case terminating:
		r.handover[node] = true
	}
	return r.handover[node]
}

// reconcile makes the node carry the taint exactly when it needs it:
//
//   - no DaemonSet of the agent runs on the node (deleted, being deleted, or its
//     node selector, affinity or tolerations exclude the node: a NoExecute taint
//     it does not tolerate, or, with no agent pod on the node, a NoSchedule one):
//     never, and a taint there is removed, since no agent would ever come to lift
//     it;
//   - an agent pod on the node is Ready: no;
//   - an agent pod on the node is being deleted, or was since the last Ready one
//     (handover): left as it is. A rolling update or an eviction keeps the plugin
//     installed, so new pods are captured and need no taint; a removal uninstalls
//     it, and the exiting agent removes its node's taint itself (RemoveTaint);
//   - the agent pod is not Ready by the node lifecycle controller's mark, not its
//     kubelet's report (markedNotReady): left as it is. The node stopped
//     reporting; its agent was Ready then, so the plugin is installed, and the
//     node lifecycle controller keeps new pods off it with its own taints while
//     it is unreachable. Tainting it would taint every node of the cluster once
//     their kubelets lose the API server for long enough (an outage behind a
//     load balancer, or the overload of every client relisting as it recovers),
//     and hold them tainted until each kubelet reports again and each node is
//     patched twice, one by one;
//   - otherwise (no agent yet, starting, crashed, the node rebooted): yes.
//
// The patch carries the node's resourceVersion, so a taint list changed by
// someone else since the cache saw it is never overwritten: the patch fails and
// the node is looked at again.
func (r *reconciler) reconcile(ctx context.Context, name string) error {
	obj, exists, err := r.nodes.GetByKey(name)
	if err != nil {
		return err
	}
	if !exists {
		if r.takeLeft(name) {
			return r.untaintLeft(ctx, name)
		}
		return nil
	}
	node := obj.(*corev1.Node)
	cfg := r.c.cfg
	ready, running, terminating, unknown := r.agentState(name)
	ds := r.agentDaemonSet(node, running)
	handover := r.handingOver(name, ds != "", ready, terminating)
	var want bool
	var why string
	switch {
	case ds == "":
		want, why = false, "no DaemonSet of the istio-cni agent runs on it"
	case ready:
		want, why = false, "its istio-cni agent is ready"
	case handover, unknown:
		return nil
	default:
		want, why = true, "its istio-cni agent is not ready"
	}
	var kept []corev1.Taint
	has := false
	for _, t := range node.Spec.Taints {
		if t.Key == cfg.Key {
			has = has || t.Effect == cfg.Effect
			continue
		}
		kept = append(kept, t)
	}
	ours := len(node.Spec.Taints) - len(kept)
	if (want && has && ours == 1) || (!want && ours == 0) {
		return nil
	}
	taints := kept
	if want {
		taints = append(taints, corev1.Taint{Key: cfg.Key, Value: "true", Effect: cfg.Effect})
	}
	err = r.c.bounded(ctx, func(ctx context.Context) error {
		return patchTaints(ctx, r.c.client.CoreV1().Nodes(), node, taints)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if want {
		r.c.metrics.TaintsAdded.Add(1)
		r.c.log.Info("node tainted: "+why, "node", name, "taint", cfg.Key)
	} else {
		r.c.metrics.TaintsRemoved.Add(1)
		r.c.log.Info("node untainted: "+why, "node", name, "taint", cfg.Key, "daemonSet", ds)
	}
	return nil
}

// untaintLeft removes the taint from a node that left the cache, if it still
// exists: it no longer matches TAINT_NODE_LABEL_SELECTOR, so this controller will
// never look at it again.
func (r *reconciler) untaintLeft(ctx context.Context, name string) error {
	var removed bool
	err := r.c.bounded(ctx, func(ctx context.Context) (err error) {
		removed, err = RemoveTaint(ctx, r.c.client.CoreV1().Nodes(), name, r.c.cfg.Key)
		return err
	})
	if err != nil {
		return err
	}
	if removed {
		r.c.metrics.TaintsRemoved.Add(1)
		r.c.log.Info("node untainted: it no longer matches "+EnvNodeSelector, "node", name, "taint", r.c.cfg.Key, "selector", r.c.cfg.NodeSelector)
	}
	return nil
}

// APITimeout bounds each call of a worker to the API server: a node's patch, or
// the read and patch (retried on a conflict) that take the taint off a node that
// left the selector. The agent's API client has no overall timeout, which would
// also cut the informers' watches (client-go applies http.Client.Timeout to a
// whole request, a watch's stream included); without this bound a call to an API
// server that never answers would hold its worker until the lease is lost, or for
// ever while the lease's own requests are answered. A call cut by it fails and the
// node is retried with the queue's back-off, as after any failed patch.
const APITimeout = 30 * time.Second

// bounded runs one API call with ctx bounded by the controller's API timeout; an
// error of a call cut by it says so.
func (c *Controller) bounded(ctx context.Context, call func(context.Context) error) error {
	return apibound.Call(ctx, c.apiTimeout, call)
}

// patchTaints sets node's taints, preconditioned on the resourceVersion node was
// read at.
func patchTaints(ctx context.Context, nodes corev1client.NodeInterface, node *corev1.Node, taints []corev1.Taint) error {
	if taints == nil {
		taints = []corev1.Taint{}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return err
	}
	if _, err := nodes.Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch taints of node %s: %w", node.Name, err)
	}
	return nil
}

// RemoveTaint removes every taint with key from the node, reading it from the API
// server and patching it preconditioned on what it read (never overwriting a
// concurrent change: a conflict reads it again), until ctx ends. removed is false
// when the node had no such taint, or is gone.
func RemoveTaint(ctx context.Context, nodes corev1client.NodeInterface, name, key string) (removed bool, err error) {
	return removeTaints(ctx, nodes, name, nil, []string{key})
}

// removeTaints is RemoveTaint for every taint whose key is one of keys (whatever
// its value and effect; no other taint), starting from node, a read of the node
// named name (from a cache), when it is not nil.
func removeTaints(ctx context.Context, nodes corev1client.NodeInterface, name string, node *corev1.Node, keys []string) (removed bool, err error) {
	what := strings.Join(keys, ",")
	for {
		if node == nil {
			node, err = nodes.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("read node %s to remove its taint %s: %w", name, what, err)
			}
		}
		var kept []corev1.Taint
		for _, t := range node.Spec.Taints {
			if !slices.Contains(keys, t.Key) {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return false, nil
		}
		err = patchTaints(ctx, nodes, node, kept)
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case apierrors.IsConflict(err) && ctx.Err() == nil:
			node = nil
			continue
		default:
			return false, fmt.Errorf("remove taint %s: %w", what, err)
		}
	}
}
