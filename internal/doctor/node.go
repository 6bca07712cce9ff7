package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/repair"
)

// Node is what the node-side commands (inspect, probe) need to know about the node
// they run on. The command line fills it from flags, the environment and the
// chart's mounts; tests fill it directly.
type Node struct {
	// Name is this node's name, compared with the pod's spec.nodeName.
	Name string
	// Kubeconfig is the kubeconfig file to read pods with; empty means the agent's
	// (the plugin config's kubeconfig) when present, else the in-cluster account.
	Kubeconfig string
	// ConfigFile is the plugin's config as a file (an istio-cni entry, a .conf or a
	// .conflist); when empty, ConfDir is searched as the runtime reads it.
	ConfigFile string
	ConfDir    string
	// BinDir, when set, must hold the istio-cni binary the runtime executes.
	BinDir string
	// Finder finds the pod's network namespace.
	Finder repair.NetnsFinder
}

// Where the agent's DaemonSet mounts the node's directories (charts/istio-cni).
const (
	agentHostConfDir  = "/host/etc/cni/net.d"
	agentHostBinDir   = "/host/opt/cni/bin"
	agentHostProcDir  = "/host/proc"
	agentHostNetnsDir = "/host/var/run/netns"
	nodeConfDir       = "/etc/cni/net.d"
)

// DefaultConfDir is the agent's mount of the node's CNI config directory when the
// command runs in the agent pod, else the node's usual directory.
func DefaultConfDir() string { return firstDir(agentHostConfDir, nodeConfDir) }

// DefaultBinDir is the agent's mount of the node's CNI bin directory when the
// command runs in the agent pod; on the node itself no directory is checked unless
// asked for (--bin-dir).
func DefaultBinDir() string { return firstDir(agentHostBinDir) }

// DefaultFinder searches the node's processes (the agent's /host/proc mount when
// present) and its bind-mounted namespaces, as the repair controller does.
func DefaultFinder() *repair.ProcFinder {
	f := &repair.ProcFinder{ProcDir: firstDir(agentHostProcDir, "/proc")}
	for _, d := range []string{agentHostNetnsDir, "/var/run/netns", "/run/netns"} {
		if firstDir(d) != "" {
			f.Dirs = append(f.Dirs, d)
		}
	}
	return f
}

// DefaultNodeName is NODE_NAME (the chart sets it from spec.nodeName), else the
// host name, which is the node name unless the kubelet was told otherwise.
func DefaultNodeName() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func firstDir(dirs ...string) string {
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
	}
	return ""
}

// PluginConfig reads the plugin's config: from ConfigFile when set, else from the
// istio-cni entry of the node's CNI config in ConfDir.
func (n *Node) PluginConfig() (*plugin.Config, ConfigSource, error) {
	if n.ConfigFile != "" {
		data, err := os.ReadFile(n.ConfigFile)
		if err != nil {
			return nil, ConfigSource{}, fmt.Errorf("plugin config: %w", err)
		}
		entry, layout, _, err := istioEntry(n.ConfigFile, data)
		if err != nil {
			return nil, ConfigSource{}, err
		}
		if entry == nil || layout == LayoutStandalone {
			// A bare entry, as `explain --config` takes it: how it is wired is unknown.
			entry, layout = data, LayoutFile
		}
		cfg, err := plugin.ParseConfig(entry)
		if err != nil {
			return nil, ConfigSource{}, fmt.Errorf("plugin config %s: %w", n.ConfigFile, err)
		}
		return cfg, ConfigSource{Path: n.ConfigFile, Layout: layout}, nil
	}
	if n.ConfDir == "" {
		return nil, ConfigSource{}, errors.New("no plugin config: pass --config FILE or --conf-dir DIR (the node's CNI config directory)")
	}
	return LoadConfDir(n.ConfDir)
}

// Client returns an API client: Kubeconfig when set, else the plugin's own
// kubeconfig (which the agent writes into its run directory) when it exists, else
// the pod's service account (in-cluster).
func (n *Node) Client(cfg *plugin.Config) (*kube.Client, string, error) {
	path := n.Kubeconfig
	if path == "" && cfg != nil {
		if _, err := os.Stat(cfg.Kubeconfig); err == nil {
			path = cfg.Kubeconfig
		}
	}
	var kc *kube.Kubeconfig
	var err error
	source := path
	if path != "" {
		kc, err = kube.LoadKubeconfig(path)
		if err == nil && n.Kubeconfig == "" {
			err = cfg.OverrideServer(kc)
		}
	} else {
		kc, err = inClusterKubeconfig()
		source = "in-cluster service account"
	}
	if err != nil {
		return nil, "", fmt.Errorf("API server access: %w", err)
	}
	c, err := kube.NewClient(kc, 10*time.Second)
	if err != nil {
		return nil, "", fmt.Errorf("API server access (%s): %w", source, err)
	}
	return c, source, nil
}

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// agentNamespace is the agents' namespace for the commands a hint gives: the
// doctor runs in an agent's pod, whose POD_NAMESPACE the chart sets; kube-system
// (the chart's usual one) elsewhere.
func agentNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "kube-system"
}

func inClusterKubeconfig() (*kube.Kubeconfig, error) {
	return inClusterKubeconfigFrom(os.Getenv, serviceAccountDir)
}

// inClusterKubeconfigFrom is inClusterKubeconfig with the environment and the
// service account's directory given. The host is taken as the agent takes it
// (--kubernetes-service-host): an IPv6 address with or without its brackets.
func inClusterKubeconfigFrom(getenv func(string) string, saDir string) (*kube.Kubeconfig, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("no kubeconfig: pass --kubeconfig, or run where the agent's istio-cni-kubeconfig exists or inside a pod (KUBERNETES_SERVICE_HOST is not set)")
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("in-cluster config: %w", err)
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return &kube.Kubeconfig{
		Server:    "https://" + net.JoinHostPort(host, port),
		CAData:    ca,
		TokenFile: filepath.Join(saDir, "token"),
	}, nil
}

// unroutableHint is what to add to an API call's error when this process's
// network namespace had no route to the API server's address (ENETUNREACH,
// EHOSTUNREACH): the doctor runs in the agent's pod, on the node's network, so
// the node's routes are what to look at; "" for any other error.
func unroutableHint(err error) string {
	if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EHOSTUNREACH) {
		return ""
	}
	return "; this network namespace has no route to the API server's address: in the agent's pod that is the node's network " +
		"(hostNetwork), so look at the node's routes to it (ip route get ADDRESS on the node) and at what provides the kubernetes Service's address there (kube-proxy or its replacement)"
}

// ParsePodRef parses NAMESPACE/NAME.
func ParsePodRef(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want NAMESPACE/POD", s)
	}
	return namespace, name, nil
}

// ErrNotOnThisNode means the pod is scheduled on another node: its namespace and
// rules can only be seen there.
var ErrNotOnThisNode = errors.New("pod is not on this node")

// GetPod reads the pod and checks that it runs on this node.
func (n *Node) GetPod(ctx context.Context, c *kube.Client, namespace, name string) (*kube.Pod, error) {
	var pod kube.Pod
	if err := c.Get(ctx, kube.PodPath(namespace, name), &pod); err != nil {
		if errors.Is(err, kube.ErrNotFound) {
			return nil, fmt.Errorf("pod %s/%s not found in the API server (kubectl get pods -n %s)", namespace, name, namespace)
		}
		return nil, fmt.Errorf("get pod %s/%s: %w%s", namespace, name, err, unroutableHint(err))
	}
	switch node := pod.Spec.NodeName; {
	case node == "":
		return &pod, fmt.Errorf("%w: pod %s is not scheduled on any node yet", ErrNotOnThisNode, pod.Key())
	case node != n.Name:
		return &pod, fmt.Errorf("%w: pod %s runs on node %q, this is node %q; run the command on that node's agent: "+
			"kubectl exec -n %[5]s $(kubectl get pods -n %[5]s -l k8s-app=istio-cni-node --field-selector spec.nodeName=%[3]s -o name) -- istio-cni-doctor ...",
			ErrNotOnThisNode, pod.Key(), node, n.Name, agentNamespace())
	}
	return &pod, nil
}

// PodNamespace reads the pod's namespace when the plugin's decision needs it (a pod
// without a sidecar whose own istio.io/dataplane-mode label does not decide: see
// plugin.PlanFor), as the plugin's ADD does; nil otherwise.
func (n *Node) PodNamespace(ctx context.Context, c *kube.Client, cfg *plugin.Config, pod *kube.Pod) (*kube.Namespace, error) {
	if pp, _ := plugin.PlanFor(plugin.ArgsFor(pod), cfg, pod, nil, plugin.Sandbox{}); pp.Decision.Rule != plugin.RuleNeedNamespace {
		return nil, nil
	}
	var ns kube.Namespace
	if err := c.Get(ctx, kube.NamespacePath(pod.Metadata.Namespace), &ns); err != nil {
		return nil, fmt.Errorf("get namespace %s (its %s label decides for pod %s): %w", pod.Metadata.Namespace, plugin.LabelDataplaneMode, pod.Key(), err)
	}
	return &ns, nil
}

// FindNetns finds the pod's network namespace on this node from its addresses.
func (n *Node) FindNetns(ctx context.Context, pod *kube.Pod) (*repair.Netns, error) {
	ips := pod.IPs()
	if pod.Ended() {
		return nil, fmt.Errorf("pod %s has ended (phase %s): its sandbox is gone, and the address in its status %s may be another pod's by now, "+
			"so there are no rules of its own to read; `istio-cni-doctor logs --pod %s` shows the plugin's ADD for it", pod.Key(), pod.Status.Phase, addrStrings(ips), pod.Key())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("pod %s has no IP address in its status: its sandbox is not up yet "+
			"(a pod stuck in ContainerCreating: see `istio-cni-doctor logs --pod %s` for the plugin's ADD)", pod.Key(), pod.Key())
	}
	ns, err := n.Finder.Find(ctx, ips)
	if err != nil {
		if errors.Is(err, repair.ErrNetnsNotFound) {
			return nil, fmt.Errorf("network namespace of pod %s not found on this node: %w "+
				"(is the pod running? in the agent pod the node's /proc must be mounted at /host/proc; pass --proc-dir otherwise)", pod.Key(), err)
		}
		return nil, fmt.Errorf("network namespace of pod %s: %w", pod.Key(), err)
	}
	// Its status may be behind a sandbox that died: the address is then another
	// pod's, whose rules are not this pod's to show or probe.
	if err := ns.CheckSandboxOf(pod); err != nil {
		ns.Close()
		return nil, fmt.Errorf("network namespace of pod %s: %w (its rules cannot be read: is it being restarted? ask again in a moment)", pod.Key(), err)
	}
	return ns, nil
}

func addrStrings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}
