package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/istio-cni/istio-cni/internal/apibound"
	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// Event reasons on the pod. The delete and label ones are Istio's.
const (
	ReasonRepairBrokenPod = "RepairBrokenPod"
	ReasonDeleteBrokenPod = "DeleteBrokenPod"
	ReasonLabelBrokenPod  = "LabelBrokenPod"
	ReasonRepairGaveUp    = "RepairBrokenPodGaveUp"
	// ReasonMissingNetwork is ours: a meshed pod that Multus never attaches to the
	// plugin, because its networks annotation does not name the plugin's network.
	ReasonMissingNetwork = "MissingMultusNetwork"
	// ReasonNotCaptured is ours: a broken pod that the plugin skips (its namespace
	// is excluded, DISABLE_ENVOY, sidecar.istio.io/inject=false...), so neither a
	// repair nor a replacement can make its validation pass.
	ReasonNotCaptured = "NotCapturedByPlugin"
	// ReasonStaticPod is ours: a broken static pod, which deleting cannot
	// restart (the kubelet runs it from its manifest and only recreates the
	// mirror pod in the API server).
	ReasonStaticPod = "BrokenStaticPodNotDeleted"
)

// EventComponent is the events' source component.
const EventComponent = "istio-cni-repair"

// Client is the part of the API the controller uses. A kubernetes.Interface
// clientset satisfies it; the agent passes a client of the core group alone, so
// that its binary does not link a client for every API group.
type Client interface {
	CoreV1() typedcorev1.CoreV1Interface
}

// Deps are what the controller needs besides its settings and client.
type Deps struct {
	// Logger receives progress; nil: slog.Default().
	Logger *slog.Logger
	// Recorder writes events on pods; nil: one writing to the API server as
	// istio-cni-repair on this node, stopped when Run returns.
	Recorder record.EventRecorder
	// Metrics receives the counters; nil: a new set (see Controller.Metrics).
	Metrics *Metrics
	// InPlace is how pods are repaired in place; required when Config.RepairPods.
	InPlace *InPlace
	// Plugin is the node's plugin config, for the plugin's verdict on a broken pod:
	// one the plugin skips is reported once (and labelled when the label is
	// allowed), never deleted, since its replacement would fail the same way. nil:
	// InPlace's, else no verdict is asked and every broken pod is acted on.
	Plugin *plugin.Config
	// Workers is the number of pods handled in parallel; 0: 2.
	Workers int
	// NodePods is the informer of the node's pods that the agent shares between
	// its parts, run by its owner; nil: the controller builds and runs its own. It
	// is used only when it selects exactly what the controller would (see
	// Controller.SharesNodePods).
	NodePods *informer.NodePods
	// APITimeout bounds each write the workers make to the API server; 0:
	// APITimeout.
	APITimeout time.Duration
}

// InPlace is the plugin's programming path, as the node's plugin is configured:
// the same pod-to-rules function (plugin.PlanFor) and apply (capture.Apply) as a
// CNI ADD, so a repaired pod gets exactly the rules the plugin would have given it.
type InPlace struct {
	// Plugin is the node's plugin config (the one the agent installs).
	Plugin *plugin.Config
	// Backend programs the rules, the one the plugin config selects.
	Backend capture.Backend
	// Finder finds the pod's namespace; nil: a ProcFinder over Config.ProcDir and
	// Config.NetnsDirs.
	Finder NetnsFinder
}

// Controller watches this node's pods and acts on broken ones. Create it with New
// and start it with Run.
type Controller struct {
	cfg     Config
	client  Client
	log     *slog.Logger
	metrics *Metrics
	inPlace *InPlace
	workers int
	// apiTimeout bounds each write to the API server (Deps.APITimeout).
	apiTimeout time.Duration
	recorder   record.EventRecorder
	ownRec     record.EventBroadcaster

	informer cache.SharedIndexInformer
	// ownInformer: Run runs the informer; false when it is Deps.NodePods.
	ownInformer bool
	// synced is the event handler's: the first list is in the cache and has been
	// handed to onChange.
	synced func() bool
	queue  workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// repaired remembers pods repaired in place, and the failed run of the
	// validation container repaired, until they no longer look broken: the pod
	// keeps looking broken until the kubelet restarts its validation container,
	// and every status change in the meantime must not search for and program the
	// namespace again. A later run that fails is repaired again.
	repaired map[string]repairedFailure
	// reported remembers, by UID, the pods reported for a missing Multus network or
	// for the plugin skipping them: such a pod stays broken for as long as it lives,
	// and is reported once.
	reported map[types.UID]bool
	// plugin is the config whose verdict decides that a pod is not the plugin's
	// (Deps.Plugin or InPlace.Plugin); nil: not asked.
	plugin *plugin.Config
}

// repairedFailure is a pod, by uid, and the failed run of its validation
// container (failureID) that an in-place repair programmed the namespace for.
type repairedFailure struct {
	uid types.UID
	run string
}

// New checks cfg and builds the controller; it starts nothing.
func New(cfg Config, client Client, deps Deps) (*Controller, error) {
	if err := settings.CheckEnabled("repair controller", EnvEnabled, cfg.Enabled, cfg.Validate); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("repair controller: no Kubernetes client")
	}
	c := &Controller{
		cfg:        cfg,
		client:     client,
		log:        deps.Logger,
		metrics:    deps.Metrics,
		inPlace:    deps.InPlace,
		workers:    deps.Workers,
		apiTimeout: cmp.Or(deps.APITimeout, APITimeout),
		recorder:   deps.Recorder,
		repaired:   map[string]repairedFailure{},
		reported:   map[types.UID]bool{},
		plugin:     deps.Plugin,
	}
	if c.plugin == nil && deps.InPlace != nil {
		c.plugin = deps.InPlace.Plugin
	}
	c.log = cmp.Or(c.log, slog.Default()).With("controller", "repair", "node", cfg.NodeName)
	if c.metrics == nil {
		c.metrics = &Metrics{}
	}
	if c.workers <= 0 {
		c.workers = 2
	}
	if cfg.RepairPods {
		if c.inPlace == nil || c.inPlace.Plugin == nil || c.inPlace.Backend == nil {
			return nil, fmt.Errorf("repair controller: %s=true needs the plugin config and a rule backend (Deps.InPlace)", EnvRepairPods)
		}
		ip := *c.inPlace
		if ip.Finder == nil {
			ip.Finder = &ProcFinder{ProcDir: cfg.ProcDir, Dirs: cfg.NetnsDirs}
		}
		c.inPlace = &ip
	}
	if c.recorder == nil {
		c.ownRec = record.NewBroadcaster()
		c.recorder = c.ownRec.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent, Host: cfg.NodeName})
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "repair"})

	// Only this node's pods are listed and watched: the API server filters, so the
	// cache and the traffic do not grow with the cluster.
	if p := deps.NodePods; p != nil && cfg.selectsAllPodsOf(p.Node) {
		c.informer = p.Informer
	} else {
		// No shared informer, or REPAIR_LABEL_SELECTORS / REPAIR_FIELD_SELECTORS narrow
		// the selection (or REPAIR_NODE_NAME names another node): the shared informer
		// would hand this controller pods it must not act on, so it keeps its own,
		// a second watch of (part of) the node's pods.
		c.informer = informer.Pods(client.CoreV1(), informer.Selector{Label: cfg.LabelSelector, Field: cfg.fieldSelector()})
		c.ownInformer = true
	}
	reg, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onChange,
		UpdateFunc: func(_, obj any) { c.onChange(obj) },
		DeleteFunc: c.onDelete,
	})
	if err != nil {
		return nil, fmt.Errorf("repair controller: %w", err)
	}
	c.synced = reg.HasSynced
	return c, nil
}

// SharesNodePods reports whether the controller reads its pods from Deps.NodePods
// (whose owner must run it) rather than from an informer of its own.
func (c *Controller) SharesNodePods() bool { return !c.ownInformer }

// Metrics returns the controller's counters.
func (c *Controller) Metrics() *Metrics { return c.metrics }

// HasSynced reports whether the first list of this node's pods is in the cache
// and has been handed to the controller.
func (c *Controller) HasSynced() bool { return c.synced() }

func (c *Controller) onChange(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := cache.MetaObjectToName(pod).String()
	if broken, _ := Broken(&c.cfg, pod); broken {
		c.queue.Add(key)
		return
	}
	// Its validation passed: a repair is done with. A failure seen later is a new
	// sandbox's (the kubelet makes one, for the same pod and uid, when the pod's
	// dies), whose namespace is still to be programmed.
	c.mu.Lock()
	delete(c.repaired, key)
	c.mu.Unlock()
}

func (c *Controller) onDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		c.mu.Lock()
		delete(c.repaired, cache.MetaObjectToName(pod).String())
		delete(c.reported, pod.UID)
		c.mu.Unlock()
	}
}

// Run watches and repairs until ctx ends. It returns an error only when the cache
// cannot be filled.
func (c *Controller) Run(ctx context.Context) error {
	if c.ownRec != nil {
		c.ownRec.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.ownRec.Shutdown()
	}
	defer c.queue.ShutDown()
	if c.ownInformer {
		// Run returns only once its informer has stopped, so that a caller waiting
		// for it knows the watch is closed. A shared one is its owner's to run.
		var informerDone sync.WaitGroup
		informerDone.Go(func() { c.informer.RunWithContext(ctx) })
		defer informerDone.Wait()
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return fmt.Errorf("repair controller: pods of node %s never listed: %w", c.cfg.NodeName, ctx.Err())
	}
	c.log.Info("repair controller started", "repairPods", c.cfg.RepairPods, "deletePods", c.cfg.DeletePods, "labelPods", c.cfg.LabelPods)
	var wg sync.WaitGroup
	for range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	attempt := c.queue.NumRequeues(key) + 1
	last := attempt >= c.cfg.MaxRetries
	pod, err := c.reconcile(ctx, key, last)
	switch {
	case err == nil:
		c.queue.Forget(key)
	case !last:
		c.metrics.Retries.Add(1)
		c.log.Warn("pod not repaired yet, retrying", "pod", key, "attempt", attempt, "error", err)
		c.queue.AddRateLimited(key)
	default:
		c.queue.Forget(key)
		c.metrics.GaveUp.Add(1)
		c.log.Error("giving up on broken pod", "pod", key, "attempts", attempt, "error", err)
		if pod != nil {
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonRepairGaveUp,
				"istio-cni gave up after %d attempts; the pod's traffic is still not redirected to its sidecar: %v", attempt, err)
		}
	}
	return true
}

// reconcile acts on the cached pod under key if it is broken. last says this is
// the final attempt, when a failed in-place repair falls back to the next action.
func (c *Controller) reconcile(ctx context.Context, key string, last bool) (*corev1.Pod, error) {
	obj, exists, err := c.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return nil, err
	}
	pod := obj.(*corev1.Pod)
	broken, why := Broken(&c.cfg, pod)
	if !broken {
		return pod, nil
	}
	c.metrics.Detected.Add(1)
	if c.cfg.MultusNetwork != "" {
		if attached, parseErr := multus.Attaches(pod.Annotations, c.cfg.MultusNetwork); !attached {
			return pod, c.reportMissingNetwork(ctx, pod, why, parseErr)
		}
	}
	if skip := c.pluginSkips(pod); skip != "" {
		return pod, c.reportNotCaptured(ctx, pod, why, skip)
	}
	return pod, c.act(ctx, pod, why, last)
}

// pluginSkips is the plugin's reason for leaving pod alone ("" when it captures
// it, or cannot tell without more than the pod). Its validation then fails
// whatever happens, and so will its replacement's.
func (c *Controller) pluginSkips(pod *corev1.Pod) string {
	if c.plugin == nil {
		return ""
	}
	kp, err := KubePod(pod)
	if err != nil {
		return ""
	}
	pp, _ := plugin.PlanFor(plugin.ArgsFor(kp), c.plugin, kp, nil, plugin.Sandbox{})
	if pp.Decision.Verdict != plugin.Skip {
		return ""
	}
	return pp.Decision.Reason
}

// reportNotCaptured handles a broken pod that the plugin skips: deleting it would
// only bring back a pod broken the same way, again and again, and there is nothing
// to program in place. It is reported once (an event and a log line) and labelled
// when this agent may label pods, and left running.
func (c *Controller) reportNotCaptured(ctx context.Context, pod *corev1.Pod, why, skip string) error {
	return c.reportOnce(ctx, pod, c.mayLabelReported(), ReasonNotCaptured, &c.metrics.NotCaptured,
		fmt.Sprintf("%s, but the plugin does not capture this pod (%s), so no repair and no replacement can make its validation pass; "+
			"remove istio-validation from the pod or make the plugin capture it; not deleted nor repaired", why, skip))
}

// mayLabelReported says whether a pod reported instead of deleted is labelled too.
// Labelling is an action only when deleting does not win over it (act): with both
// on, as the chart's defaults are, the agent holds no pods/status grant.
func (c *Controller) mayLabelReported() bool {
	return (c.cfg.LabelPods && !c.cfg.DeletePods) || c.cfg.RepairPods || c.cfg.MultusNetwork != ""
}

// reportStatic handles a broken static pod where the action would be to delete
// it: deleting its mirror (the API server's pod) does not stop or restart it, the
// kubelet only creates the mirror again, broken the same way, to be deleted again
// and again. It is reported once (an event and a log line naming the fix) and
// labelled when this agent may label pods, and left running. repairErr is why an
// in-place repair did not help, when one was tried.
func (c *Controller) reportStatic(ctx context.Context, pod *corev1.Pod, why string, repairErr error) error {
	msg := why
	if repairErr != nil {
		msg += fmt.Sprintf("; not repaired in place (%v)", repairErr)
	}
	msg += fmt.Sprintf("; it is a static pod (%s): deleting it in the API server would not restart it, so it is not deleted; "+
		"restart it on its node (move its manifest out of the kubelet's staticPodPath and back) once istio-cni is ready there", kube.MirrorAnnotation)
	return c.reportOnce(ctx, pod, c.mayLabelReported(), ReasonStaticPod, &c.metrics.StaticPods, msg)
}

// reportOnce reports pod the first time (firstReport: an event of reason, a log
// line and count), after labelling it when mayLabel: the report says "labelled"
// only once the label is set, and that labelling failed when it did (the pod is
// then tried again with its back-off, and a later label is logged).
func (c *Controller) reportOnce(ctx context.Context, pod *corev1.Pod, mayLabel bool, reason string, count *atomic.Uint64, msg string) error {
	first := c.firstReport(pod)
	var changed bool
	var err error
	if mayLabel {
		changed, err = c.setLabel(ctx, pod)
	}
	if !first {
		if changed {
			c.log.Info("labelled broken pod", "pod", cache.MetaObjectToName(pod).String(), "label", c.cfg.LabelKey+"="+c.cfg.LabelValue, "reason", reason)
		}
		return err
	}
	count.Add(1)
	switch {
	case mayLabel && err != nil:
		msg += fmt.Sprintf("; labelling it %s=%s failed (tried again): %v", c.cfg.LabelKey, c.cfg.LabelValue, err)
	case mayLabel:
		msg += fmt.Sprintf(": labelled %s=%s", c.cfg.LabelKey, c.cfg.LabelValue)
	}
	c.log.Warn(msg, "pod", cache.MetaObjectToName(pod).String(), "uid", pod.UID)
	c.recorder.Event(pod, corev1.EventTypeWarning, reason, msg)
	return err
}

// firstReport says whether pod is to be reported now: neither this agent (its
// memory) nor an earlier one (the label) reported it; from now on it has been.
func (c *Controller) firstReport(pod *corev1.Pod) bool {
	labelled := pod.Labels[c.cfg.LabelKey] == c.cfg.LabelValue
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.reported[pod.UID] && !labelled
	c.reported[pod.UID] = true
	return first
}

// reportMissingNetwork handles a broken pod that Multus never attaches to the
// plugin: its k8s.v1.cni.cncf.io/networks annotation does not name the network.
// Repairing it in place would hide the cause, and deleting it would only bring
// back a pod broken the same way, again and again; so it is reported once (an
// event and a log line naming the fix) and labelled, and left running. The label
// is what says "reported" to the next agent (after a restart), the memory what
// says it to this one while its cache has not seen the label yet, or when the
// label could not be set.
func (c *Controller) reportMissingNetwork(ctx context.Context, pod *corev1.Pod, why string, parseErr error) error {
	return c.reportOnce(ctx, pod, true, ReasonMissingNetwork, &c.metrics.MissingNetwork,
		missingNetworkMessage(pod, c.cfg.MultusNetwork, why, parseErr)+"; not deleted (its replacement would miss it too) nor repaired")
}

// missingNetworkMessage says what is wrong with the pod's annotation and what to add.
func missingNetworkMessage(pod *corev1.Pod, network, why string, parseErr error) string {
	value, has := pod.Annotations[multus.NetworksAnnotation]
	var problem, fix string
	switch {
	case !has:
		problem = fmt.Sprintf("it has no %s annotation", multus.NetworksAnnotation)
		fix = fmt.Sprintf("%s: %s", multus.NetworksAnnotation, network)
	case parseErr != nil:
		problem = fmt.Sprintf("its %s annotation does not parse (%v)", multus.NetworksAnnotation, parseErr)
		fix = fmt.Sprintf("%s: %s", multus.NetworksAnnotation, network)
	case strings.HasPrefix(strings.TrimSpace(value), "["):
		problem = fmt.Sprintf("its %s annotation %q does not name %s", multus.NetworksAnnotation, value, network)
		fix = fmt.Sprintf(`{"name":%q} to the list in %s`, network, multus.NetworksAnnotation)
	default:
		problem = fmt.Sprintf("its %s annotation %q does not name %s", multus.NetworksAnnotation, value, network)
		fix = fmt.Sprintf("%s: %s,%s", multus.NetworksAnnotation, strings.TrimSpace(value), network)
	}
	return fmt.Sprintf("%s: Multus never runs istio-cni for this pod, because %s. Add %s to the pod template "+
		"(Istio's injector adds it with values.sidecarInjectorWebhook.injectedAnnotations) and recreate the pod", why, problem, fix)
}

// act applies the configured action to a pod found broken: repair in place, else
// delete, else label. When an in-place repair cannot help (the plugin would not
// capture the pod, or its validation never runs again) or fails for the last
// time, the next configured action is taken instead.
func (c *Controller) act(ctx context.Context, pod *corev1.Pod, why string, last bool) error {
	var repairErr error
	if c.cfg.RepairPods {
		done, notApplicable, err := c.repairInPlace(ctx, pod, why)
		switch {
		case done:
			return nil
		case err != nil && !last:
			return err
		case err != nil:
			repairErr = err
		case notApplicable != "":
			repairErr = errors.New(notApplicable)
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonRepairBrokenPod, "%s; not repaired in place: %s", why, notApplicable)
		}
		if !c.cfg.DeletePods && !c.cfg.LabelPods {
			if err == nil {
				return nil // nothing more to try, and retrying would not change the answer
			}
			return err
		}
		c.log.Info("in-place repair not possible, falling back", "pod", cache.MetaObjectToName(pod).String(), "reason", repairErr)
	}
	if c.cfg.DeletePods {
		if _, static := pod.Annotations[kube.MirrorAnnotation]; static {
			return c.reportStatic(ctx, pod, why, repairErr)
		}
		return c.deletePod(ctx, pod, why)
	}
	return c.labelPod(ctx, pod, why)
}

// deletePod deletes the pod exactly as it was judged: a UID precondition so that a
// pod recreated under the same name is never deleted for its predecessor's
// failure, and a resourceVersion one so that a pod that changed since is judged again.
func (c *Controller) deletePod(ctx context.Context, pod *corev1.Pod, why string) error {
	key := cache.MetaObjectToName(pod).String()
	uid, rv := pod.UID, pod.ResourceVersion
	err := c.bounded(ctx, func(ctx context.Context) error {
		return c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
		})
	})
	switch {
	case err == nil:
		c.metrics.count(ActionDelete, ResultSuccess)
		c.log.Info("deleted broken pod", "pod", key, "uid", uid, "reason", why)
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonDeleteBrokenPod, "%s; deleted so that it is recreated with istio-cni in place", why)
		return nil
	case apierrors.IsNotFound(err):
		c.metrics.count(ActionDelete, ResultSkip)
		return nil
	default:
		c.metrics.count(ActionDelete, ResultFail)
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonDeleteBrokenPod, "%s; delete failed: %v", why, err)
		return fmt.Errorf("delete broken pod %s (uid %s): %w", key, uid, err)
	}
}

// labelPod sets the broken-pod label, and says so in an event and the log.
func (c *Controller) labelPod(ctx context.Context, pod *corev1.Pod, why string) error {
	changed, err := c.setLabel(ctx, pod)
	if err != nil {
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonLabelBrokenPod, "%s; labelling failed: %v", why, err)
		return err
	}
	if changed {
		c.log.Info("labelled broken pod", "pod", cache.MetaObjectToName(pod).String(), "label", c.cfg.LabelKey+"="+c.cfg.LabelValue, "reason", why)
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonLabelBrokenPod, "%s; labelled %s=%s", why, c.cfg.LabelKey, c.cfg.LabelValue)
	}
	return nil
}

// setLabel sets the broken-pod label through the pods/status subresource, which
// may change labels and is a smaller grant than patching pods. It reports whether
// it changed the pod (false: already labelled, or gone).
func (c *Controller) setLabel(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if v, ok := pod.Labels[c.cfg.LabelKey]; ok && v == c.cfg.LabelValue {
		c.metrics.count(ActionLabel, ResultSkip)
		return false, nil
	}
	patch, err := labelPatch(pod.UID, c.cfg.LabelKey, &c.cfg.LabelValue)
	if err != nil {
		return false, err
	}
	err = c.bounded(ctx, func(ctx context.Context) error {
		_, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	})
	if apierrors.IsNotFound(err) {
		c.metrics.count(ActionLabel, ResultSkip)
		return false, nil
	}
	if err != nil {
		c.metrics.count(ActionLabel, ResultFail)
		return false, fmt.Errorf("label broken pod %s: %w", cache.MetaObjectToName(pod).String(), err)
	}
	c.metrics.count(ActionLabel, ResultSuccess)
	return true, nil
}

// repairTimeout bounds one in-place repair (namespace search and apply).
const repairTimeout = 30 * time.Second

// APITimeout bounds each write of the workers to the API server (a pod's delete,
// its label's patch). The agent's API client has no overall timeout, which would
// also cut the informers' watches (client-go applies http.Client.Timeout to a
// whole request, a watch's stream included); without this bound a write to an API
// server that never answers would hold its worker for ever, and with every worker
// held, no pod would be repaired again. A write cut by it fails and is retried
// with the pod's back-off, as any failed write.
const APITimeout = 30 * time.Second

// bounded runs one API call with ctx bounded by the controller's API timeout; an
// error of a call cut by it says so.
func (c *Controller) bounded(ctx context.Context, call func(context.Context) error) error {
	return apibound.Call(ctx, c.apiTimeout, call)
}
