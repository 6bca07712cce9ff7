package taint

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

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

// Client is the part of the API the controller uses: nodes and pods, and the
// lease. A kubernetes.Interface clientset satisfies it; the agent passes clients
// of these two groups alone, so that its binary does not link a client for every
// API group.
type Client interface {
	CoreV1() corev1client.CoreV1Interface
	CoordinationV1() coordinationv1client.CoordinationV1Interface
}

// Deps are optional.
type Deps struct {
	Logger  *slog.Logger
	Metrics *Metrics
}

// Controller keeps the readiness taint on exactly the nodes whose agent pod is not
// Ready, while it holds the lease.
type Controller struct {
	cfg     Config
	client  Client
	log     *slog.Logger
	metrics *Metrics
}

// New checks cfg; it starts nothing.
func New(cfg Config, client Client, deps Deps) (*Controller, error) {
	if err := settings.CheckEnabled("taint controller", EnvEnabled, cfg.Enabled, cfg.Validate); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("taint controller: no Kubernetes client")
	}
	c := &Controller{cfg: cfg, client: client, log: deps.Logger, metrics: deps.Metrics}
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
// context ends). A fresh cache per leadership: a standby replica holds none.
func (c *Controller) lead(ctx context.Context) error {
	nodeAPI, podAPI := c.client.CoreV1().Nodes(), c.client.CoreV1().Pods(c.cfg.AgentNamespace)
	nodes := informer.New(&corev1.Node{}, informer.Selector{Label: c.cfg.NodeSelector}, nodeAPI.List, nodeAPI.Watch)
	pods := informer.New(&corev1.Pod{}, informer.Selector{Label: c.cfg.AgentSelector}, podAPI.List, podAPI.Watch)
	if err := pods.AddIndexers(cache.Indexers{nodeIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "taint"})
	defer queue.ShutDown()
	enqueueNode := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
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
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueNode, UpdateFunc: func(_, n any) { enqueueNode(n) },
	}); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueuePodNode, UpdateFunc: func(o, n any) { enqueuePodNode(o); enqueuePodNode(n) }, DeleteFunc: enqueuePodNode,
	}); err != nil {
		return err
	}
	// lead returns only once both informers have stopped: the next leadership
	// starts from fresh caches, and a lost lease leaves no watch open.
	var informers sync.WaitGroup
	informers.Go(func() { nodes.RunWithContext(ctx) })
	informers.Go(func() { pods.RunWithContext(ctx) })
	defer informers.Wait()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, pods.HasSynced) {
		return ctx.Err()
	}
	r := &reconciler{c: c, nodes: nodes.GetIndexer(), pods: pods.GetIndexer()}
	informer.Work(ctx, queue, 2, r.reconcile, func(name string, err error) {
		c.metrics.PatchFailures.Add(1)
		c.log.Warn("node taint not updated, retrying", "node", name, "error", err)
	})
	return nil
}

type reconciler struct {
	c     *Controller
	nodes cache.Indexer
	pods  cache.Indexer
}

// agentReady: an agent pod on the node is Ready and not being deleted.
func (r *reconciler) agentReady(node string) bool {
	objs, _ := r.pods.ByIndex(nodeIndex, node)
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
	}
	return false
}

// reconcile makes the node carry the taint exactly when its agent is not ready.
// The patch carries the node's resourceVersion, so a taint list changed by
// someone else since the cache saw it is never overwritten: the patch fails and
// the node is looked at again.
func (r *reconciler) reconcile(ctx context.Context, name string) error {
	obj, exists, err := r.nodes.GetByKey(name)
	if err != nil || !exists {
		return err
	}
	node := obj.(*corev1.Node)
	want := !r.agentReady(name)
	cfg := r.c.cfg
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
	_, err = r.c.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch taints of node %s: %w", name, err)
	}
	if want {
		r.c.metrics.TaintsAdded.Add(1)
		r.c.log.Info("node tainted: its istio-cni agent is not ready", "node", name, "taint", cfg.Key)
	} else {
		r.c.metrics.TaintsRemoved.Add(1)
		r.c.log.Info("node untainted: its istio-cni agent is ready", "node", name, "taint", cfg.Key)
	}
	return nil
}
