package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/nad"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/taint"
)

// controllerStopWait bounds how long shutdown waits for the controllers: the taint
// and Multus controllers release their leases with an API call that an unreachable API server
// would hold up, and the node's files must still be cleaned up within the pod's
// grace period. The exit decision's requests are made meanwhile, so it is no
// longer than ExitLookupBound (see ExitBound).
const controllerStopWait = 3 * time.Second

// The wait before a feature that stopped with an error is started again: from
// featureRetryMin, doubling to featureRetryMax while it keeps stopping; a run that
// lasted featureRetryMax or more starts the doubling over.
const (
	featureRetryMin = time.Second
	featureRetryMax = 30 * time.Second
)

// keepRunning runs the feature called name until ctx ends. A run that ends with an
// error while ctx is live (the pod cache could not take its socket or make its
// files' directory, say) is logged and started again after a delay, and counted
// (istio_cni_agent_feature_restarts_total): stopping for good would leave the agent
// ready without the feature until it restarts, every ADD asking the API server. A
// run that ends without an error is done (the exit decision once it knows its
// DaemonSet).
func (a *agent) keepRunning(ctx context.Context, name string, run func(context.Context) error) {
	var delay time.Duration
	for {
		start := time.Now()
		err := run(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if time.Since(start) >= featureRetryMax {
			delay = 0
		}
		delay = min(max(2*delay, featureRetryMin), featureRetryMax)
		a.log.Error(name+" stopped", "error", err, "retryIn", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		a.m.featureRestarts.WithLabelValues(name).Inc()
		a.log.Info("starting " + name + " again")
	}
}

// RestConfig is the agent's own API client config, from the same settings as the
// plugin's kubeconfig. The token is read from its file, not copied: client-go
// re-reads the file, so a rotated projected token is picked up without a restart.
// It sets no Timeout on purpose: client-go applies it to a whole request, a watch's
// stream included, so it would cut the informers' watches; the controllers bound
// each of their own calls instead (repair.APITimeout, taint.APITimeout,
// nad.APITimeout).
func RestConfig(s *Settings) *rest.Config {
	c := &rest.Config{
		Host:            s.KubeProtocol + "://" + net.JoinHostPort(s.KubeHost, strconv.Itoa(int(s.KubePort))),
		BearerTokenFile: s.TokenFile(),
		UserAgent:       "istio-cni-agent",
	}
	if s.SkipTLSVerify {
		c.TLSClientConfig.Insecure = true
	} else {
		c.TLSClientConfig.CAFile = s.CAFile()
	}
	return c
}

// apiClient is the agent's API client: the three typed API groups it calls (core,
// coordination for the leases, apps for its own DaemonSet on exit and the taint
// controller's DaemonSets), and the dynamic and metadata
// clients (NetworkAttachmentDefinitions, pods' and namespaces' metadata). The full
// clientset would link a typed client and apply configurations for every API group
// into the binary. It satisfies podcache.Client, repair.Client, taint.Client and
// nad.Client.
type apiClient struct {
	core         corev1client.CoreV1Interface
	coordination coordinationv1client.CoordinationV1Interface
	apps         appsv1client.AppsV1Interface
	dynamic      dynamic.Interface
	metadata     metadata.Interface
}

func (c *apiClient) CoreV1() corev1client.CoreV1Interface { return c.core }

func (c *apiClient) AppsV1() appsv1client.AppsV1Interface { return c.apps }

func (c *apiClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return c.coordination
}

func (c *apiClient) Dynamic() dynamic.Interface { return c.dynamic }

func (c *apiClient) Metadata() metadata.Interface { return c.metadata }

// newAPIClient builds the group clients over one HTTP client, as the clientset
// does, so that they share its connections.
func newAPIClient(cfg *rest.Config) (*apiClient, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c := &apiClient{}
	var errs [5]error
	c.core, errs[0] = corev1client.NewForConfigAndClient(cfg, httpClient)
	c.coordination, errs[1] = coordinationv1client.NewForConfigAndClient(cfg, httpClient)
	c.apps, errs[2] = appsv1client.NewForConfigAndClient(cfg, httpClient)
	c.dynamic, errs[3] = dynamic.NewForConfigAndClient(cfg, httpClient)
	c.metadata, errs[4] = metadata.NewForConfigAndClient(cfg, httpClient)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return c, nil
}

// repairPluginConfig is the plugin's config as the runtime hands it to the plugin:
// the entry the agent installs, plus the cniVersion and name that a chain gives
// its plugins when the entry itself lacks them. A repair in place programs exactly
// what the plugin would have.
func repairPluginConfig(entry []byte) (*plugin.Config, error) {
	var m map[string]any
	if err := json.Unmarshal(entry, &m); err != nil {
		return nil, fmt.Errorf("plugin config entry: %w", err)
	}
	if _, ok := m["cniVersion"]; !ok {
		m["cniVersion"] = standaloneCNIVersion
	}
	if _, ok := m["name"]; !ok {
		m["name"] = PluginType
	}
	data, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("plugin config entry: %w", err)
	}
	cfg, err := plugin.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("plugin config entry: %w", err)
	}
	return cfg, nil
}

// startControllers starts what talks to the API server: the pod cache, the repair
// controller and the node readiness controller, each when enabled. None of them
// gates readiness: the plugin falls back to the API server when the cache cannot
// answer, and repair only fixes pods started before the plugin was in place, so
// neither may hold back the install that every new pod needs.
//
// Errors in the settings the node contradicts (a rule backend that cannot run)
// are returned; a feature that stops with an error while running is logged and
// started again (keepRunning). Nothing runs before start is called, which the
// agent does once every other step of its start-up that may fail has succeeded:
// the pod cache takes over a running agent's pods.sock and pod files from its
// first moment. stop cancels them and waits, for at most controllerStopWait; a
// second call does nothing.
func (a *agent) startControllers(ctx context.Context, client *apiClient) (start func() (stop func()), err error) {
	s := a.s
	if client == nil {
		return func() func() { return func() {} }, nil
	}

	type runner struct {
		name string
		run  func(context.Context) error
	}
	var runners []runner

	if a.tokens != nil {
		runners = append(runners, runner{"plugin token", func(ctx context.Context) error { a.tokens.run(ctx); return nil }})
	}
	if s.UninstallOnExit == ExitAuto {
		runners = append(runners, runner{"exit decision", func(ctx context.Context) error { return a.learnOwner(ctx, client) }})
	}

	// The pod cache and the repair controller read the node's pods from one informer:
	// one watch of them per agent, one copy in memory. Run once, here, when one of
	// them reads it.
	nodePods := informer.NewNodePods(client.CoreV1(), s.NodeName)
	nodePodsUsed := false

	if s.PodCache {
		pc := podcache.NewOnNodePods(client, nodePods, a.log.With("component", "pod-cache"))
		a.podCacheGone = pc.SocketGone
		nodePodsUsed = true
		a.m.register(podCacheMetrics(pc.Serving, &pc.Waits)...)
		sock := filepath.Join(s.RunDir, plugin.PodCacheSocketName)
		runners = append(runners, runner{"pod cache", func(ctx context.Context) error {
			// The log lines below are this run's: a run that stopped (and is started
			// again) says nothing once it has. Run itself keeps ctx, which its
			// informers, started by its first run, go on with.
			thisRun, stopped := context.WithCancel(ctx)
			defer stopped()
			go func() {
				// WaitForCacheSync polls until the first list is in and the socket
				// serves it, then stops.
				if cache.WaitForCacheSync(thisRun.Done(), pc.Serving) {
					a.log.Info("pod cache synced: the plugin reads this node's pods from the agent", "socket", sock, "node", s.NodeName)
				}
			}()
			go func() {
				// Namespaces have their own watch: without it (no RBAC to list them)
				// pods are still served and the plugin GETs namespaces itself.
				if cache.WaitForCacheSync(thisRun.Done(), func() bool { return pc.Serving() && pc.NamespacesSynced() }) {
					a.log.Info("pod cache: namespaces synced: the plugin reads their labels (ambient mode) from the agent", "socket", sock)
				}
			}()
			return pc.Run(ctx, sock)
		}})
	}

	if s.Repair.Enabled {
		// Deps.Recorder stays nil: the controller then records events through its own
		// broadcaster into the API server, as component istio-cni-repair on this node.
		deps := repair.Deps{Logger: a.log, NodePods: nodePods}
		// The plugin's verdict on a broken pod, whatever the action: a pod it skips
		// is reported, never deleted (its replacement would be broken the same way).
		cfg, err := repairPluginConfig(a.entry)
		if err != nil {
			return nil, fmt.Errorf("repair controller: %w", err)
		}
		deps.Plugin = cfg
		if s.Repair.RepairPods {
			// The image carries both iptables flavours: write the one the node's
			// plugin writes, judged from the node's binaries.
			view := plugin.NodeViewIn(s.Repair.ProcDir, s.NodeDirsRoot)
			cfg = plugin.ForNode(cfg, view)
			backend, err := plugin.NewBackend(cfg)
			if err != nil {
				return nil, fmt.Errorf("repair in place (%s=true): %w", repair.EnvRepairPods, err)
			}
			a.log.Info("repair in place programs pods with the plugin's backend", "backend", backend.Name(), "nodeRoot", view.Root)
			deps.InPlace = &repair.InPlace{Plugin: cfg, Backend: backend}
		}
		rc, err := repair.New(s.Repair, client, deps)
		if err != nil {
			return nil, err
		}
		a.m.register(repairMetrics(rc.Metrics())...)
		runners = append(runners, runner{"repair controller", rc.Run})
		if rc.SharesNodePods() {
			nodePodsUsed = true
		} else if s.PodCache {
			a.log.Info("repair controller watches the node's pods on its own, beside the pod cache's watch: its selection differs",
				repair.EnvLabelSelectors, s.Repair.LabelSelector, repair.EnvFieldSelectors, s.Repair.FieldSelector, "repairNode", s.Repair.NodeName)
		}
	}
	if nodePodsUsed {
		runners = append(runners, runner{"node's pods informer", func(ctx context.Context) error { nodePods.Run(ctx); return nil }})
	}

	if s.Taint.Enabled {
		tc, err := taint.New(s.Taint, client, taint.Deps{Logger: a.log})
		if err != nil {
			return nil, err
		}
		a.m.register(taintMetrics(tc.Metrics())...)
		runners = append(runners, runner{"node readiness controller", tc.Run})
	}

	if s.Multus.MeshedNamespaces {
		mc, err := nad.New(s.Multus, client, nad.Deps{Logger: a.log})
		if err != nil {
			return nil, err
		}
		a.m.register(multusMetrics(mc.Metrics())...)
		runners = append(runners, runner{"multus controller", mc.Run})
	}

	return func() func() {
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, r := range runners {
			wg.Add(1)
			a.m.featureRestarts.WithLabelValues(r.name)
			go func() {
				defer wg.Done()
				a.keepRunning(ctx, r.name, r.run)
			}()
		}
		a.log.Info("API server features started", "server", RestConfig(s).Host, "podCache", s.PodCache,
			"repair", s.Repair.Enabled, "taint", s.Taint.Enabled, "multusNamespaces", s.Multus.MeshedNamespaces, "node", s.NodeName)
		return sync.OnceFunc(func() {
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
				a.log.Info("API server features stopped")
			case <-time.After(controllerStopWait):
				a.log.Warn("API server features did not stop in time; going on with the uninstall", "waited", controllerStopWait)
			}
		})
	}, nil
}
