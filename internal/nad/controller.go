package nad

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/istio-cni/istio-cni/internal/apibound"
	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/lease"
	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// The resources the controller reads and writes.
var (
	NADResource         = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
	podResource         = corev1.SchemeGroupVersion.WithResource("pods")
	namespaceResource   = corev1.SchemeGroupVersion.WithResource("namespaces")
	clusterRoleResource = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}
)

// Istio's namespace labels for injection: istio-injection=enabled, or a revision
// label istio.io/rev when istio-injection is absent (istio-injection=disabled
// wins over a revision, as in Istio's webhooks).
const (
	injectionLabel = "istio-injection"
	revisionLabel  = "istio.io/rev"
)

// Client is the part of the API the controller uses: the Lease, the
// NetworkAttachmentDefinitions (a custom resource, through the dynamic client),
// and the metadata of pods, namespaces and the owner ClusterRole (labels and
// annotations are all it reads, and metadata-only watches keep a cluster's pods
// cheap to follow).
type Client interface {
	CoordinationV1() coordinationv1client.CoordinationV1Interface
	Dynamic() dynamic.Interface
	Metadata() metadata.Interface
}

// Metrics are the controller's counters.
type Metrics struct {
	// Created counts NetworkAttachmentDefinitions created.
	Created atomic.Uint64
	// CreateFailures counts creates that failed (and were retried).
	CreateFailures atomic.Uint64
	lease.Leadership
}

// Deps are optional.
type Deps struct {
	Logger  *slog.Logger
	Metrics *Metrics
	// MissingCRDRetry is how often the controller looks again for the
	// NetworkAttachmentDefinition API when it is not served; 0: 30s.
	MissingCRDRetry time.Duration
	// APITimeout bounds each call of the controller's worker to the API server;
	// 0: APITimeout.
	APITimeout time.Duration
}

// Controller keeps the NetworkAttachmentDefinition Config.Network present in every
// namespace that needs it, while it holds the Lease.
type Controller struct {
	cfg      Config
	client   Client
	log      *slog.Logger
	metrics  *Metrics
	crdRetry time.Duration
	// apiTimeout bounds each call of the worker to the API server (Deps.APITimeout).
	apiTimeout time.Duration
}

// New checks cfg; it starts nothing.
func New(cfg Config, client Client, deps Deps) (*Controller, error) {
	if err := settings.CheckEnabled("multus controller", EnvMeshedNamespaces, cfg.MeshedNamespaces, cfg.Validate); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("multus controller: no Kubernetes client")
	}
	c := &Controller{cfg: cfg, client: client, log: deps.Logger, metrics: deps.Metrics, crdRetry: deps.MissingCRDRetry,
		apiTimeout: cmp.Or(deps.APITimeout, APITimeout)}
	c.log = cmp.Or(c.log, slog.Default()).With("controller", "multus", "identity", cfg.Identity)
	if c.metrics == nil {
		c.metrics = &Metrics{}
	}
	if c.crdRetry <= 0 {
		c.crdRetry = 30 * time.Second
	}
	return c, nil
}

// Metrics returns the controller's counters.
func (c *Controller) Metrics() *Metrics { return c.metrics }

// Run campaigns for the Lease until ctx ends and, while leading, creates the
// missing objects. A standby replica keeps no watch open.
func (c *Controller) Run(ctx context.Context) error {
	return lease.RunJob(ctx, c.client.CoordinationV1(), c.cfg.LeaseNamespace, c.cfg.Config, &c.metrics.Leadership, c.log, lease.Job{
		Name: "multus controller", Leading: "leading: keeping the NetworkAttachmentDefinition in meshed namespaces", LeadingArgs: []any{"network", c.cfg.Network}, Lead: c.lead,
	})
}

// Index of the slim pod cache: the namespaces whose pods need the object.
const needsIndex = "needs"

// lead runs the informers and a worker until ctx ends; a fresh cache per term.
func (c *Controller) lead(ctx context.Context) error {
	if !c.waitForAPI(ctx) {
		return nil
	}
	md := c.client.Metadata()
	namespaces := informer.New(&metav1.PartialObjectMetadata{}, informer.Selector{}, md.Resource(namespaceResource).List, md.Resource(namespaceResource).Watch)
	pods := informer.New(&metav1.PartialObjectMetadata{}, informer.Selector{}, md.Resource(podResource).List, md.Resource(podResource).Watch)
	// A cluster's pods: keep only what says whether the pod needs the object.
	if err := pods.SetTransform(func(obj any) (any, error) { return slimPod(obj, c.cfg.Network), nil }); err != nil {
		return err
	}
	if err := pods.AddIndexers(cache.Indexers{needsIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*metav1.PartialObjectMetadata); ok && p.Annotations[needsMark] != "" {
			return []string{p.Namespace}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	nads := c.client.Dynamic().Resource(NADResource)
	byName := fields.OneTermEqualSelector("metadata.name", c.cfg.Network).String()
	defs := informer.New(&unstructured.Unstructured{}, informer.Selector{Field: byName}, nads.List, nads.Watch)

	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "multus"})
	defer queue.ShutDown()
	enqueueNamespace := func(obj any) {
		if m, ok := obj.(metav1.Object); ok {
			queue.Add(m.GetName())
		}
	}
	enqueuePodNamespace := func(obj any) {
		if p, ok := obj.(*metav1.PartialObjectMetadata); ok && p.Annotations[needsMark] != "" {
			queue.Add(p.Namespace)
		}
	}
	enqueueNADNamespace := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			queue.Add(m.GetNamespace())
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fns cache.ResourceEventHandlerFuncs
	}{
		{namespaces, cache.ResourceEventHandlerFuncs{AddFunc: enqueueNamespace, UpdateFunc: func(_, n any) { enqueueNamespace(n) }}},
		{pods, cache.ResourceEventHandlerFuncs{AddFunc: enqueuePodNamespace, UpdateFunc: func(_, n any) { enqueuePodNamespace(n) }}},
		// Someone deleted the object: put it back where it is still needed.
		{defs, cache.ResourceEventHandlerFuncs{DeleteFunc: enqueueNADNamespace}},
	} {
		if _, err := h.inf.AddEventHandler(h.fns); err != nil {
			return err
		}
	}
	var informers sync.WaitGroup
	defer informers.Wait()
	for _, inf := range []cache.SharedIndexInformer{namespaces, pods, defs} {
		informers.Go(func() { inf.RunWithContext(ctx) })
	}
	if !cache.WaitForCacheSync(ctx.Done(), namespaces.HasSynced, pods.HasSynced, defs.HasSynced) {
		return nil
	}
	r := &reconciler{c: c, namespaces: namespaces.GetIndexer(), pods: pods.GetIndexer(), defs: defs.GetIndexer()}
	informer.Work(ctx, queue, 1, r.reconcile, func(ns string, err error, repeated bool) {
		if err == nil {
			c.log.Info("NetworkAttachmentDefinition up to date again", "namespace", ns)
			return
		}
		c.metrics.CreateFailures.Add(1)
		if !repeated {
			c.log.Warn("NetworkAttachmentDefinition not created, retrying (logged again when the error changes)", "namespace", ns, "error", err)
		}
	})
	return nil
}

// APITimeout bounds each call of the controller to the API server outside its
// informers: the check that the NetworkAttachmentDefinition API is served, the
// owner ClusterRole's read and a create. The agent's API client has no overall
// timeout, which would also cut the informers' watches (client-go applies
// http.Client.Timeout to a whole request, a watch's stream included); without this
// bound a call to an API server that never answers would hold the worker until the
// lease is lost, or for ever while the lease's own requests are answered. A call
// cut by it fails and is retried, as any failed call.
const APITimeout = 30 * time.Second

// bounded runs one API call with ctx bounded by the controller's API timeout; an
// error of a call cut by it says so.
func (c *Controller) bounded(ctx context.Context, call func(context.Context) error) error {
	return apibound.Call(ctx, c.apiTimeout, call)
}

// waitForAPI waits until the NetworkAttachmentDefinition API is served, saying
// once, clearly, why nothing happens when it is not (Multus is not installed, or
// its CRD is missing), rather than leaving it to the informer's retries. It
// returns false when ctx ends first.
func (c *Controller) waitForAPI(ctx context.Context) bool {
	said := false
	for {
		err := c.bounded(ctx, func(ctx context.Context) error {
			_, err := c.client.Dynamic().Resource(NADResource).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		})
		switch {
		case err == nil:
			if said {
				c.log.Info("the NetworkAttachmentDefinition API is served now")
			}
			return true
		case ctx.Err() != nil:
			return false
		case !said && apierrors.IsNotFound(err):
			c.log.Error("the NetworkAttachmentDefinition API (k8s.cni.cncf.io/v1) is not served: is Multus installed? "+
				"No NetworkAttachmentDefinition is created until it is", "retry", c.crdRetry)
			said = true
		case !said:
			c.log.Warn("cannot list NetworkAttachmentDefinitions, retrying", "error", err, "retry", c.crdRetry)
			said = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(c.crdRetry):
		}
	}
}

// needsMark is the one annotation a cached pod keeps: set when the pod needs the
// object in its namespace.
const needsMark = "multus.istio-cni/needs"

// slimPod reduces a pod's metadata to its key and whether it needs the object in
// its own namespace: it is meshed (Istio's injector gave it a sidecar), or it
// asks for the network from its own namespace. The informer may pass a pod it
// has already reduced (an initial list replaces the store through the same
// transform), so a reduced pod keeps its mark.
func slimPod(obj any, network string) any {
	p, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj
	}
	slim := &metav1.PartialObjectMetadata{TypeMeta: p.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}}
	_, meshed := p.Annotations[SidecarAnnotation]
	_, marked := p.Annotations[needsMark]
	if meshed || marked || multus.AttachesHere(p.Annotations, p.Namespace, network) {
		slim.Annotations = map[string]string{needsMark: "true"}
	}
	return slim
}

// injectionLabelled reports whether Istio injects sidecars into the namespace's pods.
func injectionLabelled(labels map[string]string) bool {
	if v, ok := labels[injectionLabel]; ok {
		return v == "enabled"
	}
	_, rev := labels[revisionLabel]
	return rev
}

type reconciler struct {
	c          *Controller
	namespaces cache.Indexer
	pods       cache.Indexer
	defs       cache.Indexer
	owner      *metav1.OwnerReference
}

// reconcile creates the object in namespace ns when ns needs it and has none.
// Whatever is there already, whoever made it, is left as it is.
func (r *reconciler) reconcile(ctx context.Context, ns string) error {
	cfg := r.c.cfg
	if slices.Contains(cfg.StaticNamespaces, ns) {
		return nil
	}
	obj, exists, err := r.namespaces.GetByKey(ns)
	if err != nil || !exists {
		return err
	}
	nsMeta := obj.(*metav1.PartialObjectMetadata)
	if nsMeta.DeletionTimestamp != nil {
		return nil
	}
	why := ""
	if injectionLabelled(nsMeta.Labels) {
		why = "namespace labelled for injection"
	} else if meshed, _ := r.pods.ByIndex(needsIndex, ns); len(meshed) > 0 {
		why = "meshed pod " + meshed[0].(*metav1.PartialObjectMetadata).Name
	} else {
		return nil
	}
	if _, exists, err := r.defs.GetByKey(ns + "/" + cfg.Network); err != nil || exists {
		return err
	}
	nad := &unstructured.Unstructured{}
	nad.SetAPIVersion(NADResource.GroupVersion().String())
	nad.SetKind("NetworkAttachmentDefinition")
	nad.SetNamespace(ns)
	nad.SetName(cfg.Network)
	nad.SetLabels(map[string]string{ManagedByLabel: ManagedByValue})
	if cfg.OwnerClusterRole != "" {
		owner, err := r.ownerRef(ctx)
		if err != nil {
			return err
		}
		nad.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}
	err = r.c.bounded(ctx, func(ctx context.Context) error {
		_, err := r.c.client.Dynamic().Resource(NADResource).Namespace(ns).Create(ctx, nad, metav1.CreateOptions{})
		return err
	})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil // made meanwhile, by helm or anyone: not ours to change
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return nil
	case err != nil:
		return fmt.Errorf("create NetworkAttachmentDefinition %s/%s: %w", ns, cfg.Network, err)
	}
	r.c.metrics.Created.Add(1)
	r.c.log.Info("created NetworkAttachmentDefinition: Multus resolves the pods' k8s.v1.cni.cncf.io/networks annotation to it",
		"namespace", ns, "name", cfg.Network, "reason", why)
	return nil
}

// ownerRef is the owner ClusterRole's reference, read once per term. It blocks no
// deletion: that would need a grant on the owner's finalizers.
func (r *reconciler) ownerRef(ctx context.Context) (*metav1.OwnerReference, error) {
	if r.owner != nil {
		return r.owner, nil
	}
	name := r.c.cfg.OwnerClusterRole
	var cr *metav1.PartialObjectMetadata
	err := r.c.bounded(ctx, func(ctx context.Context) (err error) {
		cr, err = r.c.client.Metadata().Resource(clusterRoleResource).Get(ctx, name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the owner ClusterRole %s (%s): %w", name, EnvOwnerClusterRole, err)
	}
	r.owner = &metav1.OwnerReference{
		APIVersion: clusterRoleResource.GroupVersion().String(), Kind: "ClusterRole",
		Name: cr.Name, UID: cr.UID,
	}
	return r.owner, nil
}
