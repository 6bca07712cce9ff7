package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/test/harness/childproc"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/repo"
)

// Options configure Up. The zero value is a working configuration.
type Options struct {
	// StateDir holds everything the node writes; Down removes it. It must not exist
	// or be empty. Empty: /var/lib/istio-cni-node.
	StateDir string
	// NodeName is the Node object's name. Empty: "istio-cni-node".
	NodeName string
	// PodCIDR is host-local's range for pod addresses. Zero: 10.244.0.0/24. Two
	// nodes up at once on one machine need different ranges.
	PodCIDR netip.Prefix
	// PodCIDRv6, when set, makes pods dual-stack: host-local also gives each pod an
	// IPv6 address from it, after its IPv4 one (status.podIP stays IPv4, podIPs has
	// both). Up then makes new network namespaces skip IPv6 duplicate address
	// detection (net.core.devconf_inherit_init_net=1 with
	// net.ipv6.conf.default.accept_dad=0), which would hold every pod's start for a
	// second or two while ptp waits for its address to settle; Down puts both back.
	PodCIDRv6 netip.Prefix
	// NodeIP is kubelet's --node-ip and the apiserver's --advertise-address. Zero:
	// the first IPv4 address of an up, non-loopback interface.
	NodeIP netip.Addr
	// KubeBinDir holds etcd, kube-apiserver, kubelet, kube-scheduler and
	// kube-controller-manager. Empty: hack/kube-binaries.sh's cache (built on its
	// first run).
	KubeBinDir string
	// CNIPluginDir holds the reference plugins (ptp, host-local, loopback, ...).
	// Empty: hack/cni-plugins.sh's cache.
	CNIPluginDir string
	// RuntimeBinDir holds containerd, containerd-shim-runc-v2, ctr and runc.
	// Empty: hack/runtime-binaries.sh's cache (containerd 2.x and runc built from
	// the Go module proxy on the first run; CONTAINERD_VERSION and RUNC_VERSION
	// choose them).
	RuntimeBinDir string
	// Progress receives one line per step and the first-run builds' output. Nil:
	// os.Stderr.
	Progress io.Writer
	// Timeout bounds Up once the binaries exist. Zero: 3 minutes.
	Timeout time.Duration
	// MaxPods is kubelet's maxPods. Zero: kubelet's default, 110 (the node's own
	// pods, such as the istio-cni agent, count against it).
	MaxPods int
}

// Default values of Options.
const (
	DefaultStateDir = "/var/lib/istio-cni-node"
	DefaultNodeName = "istio-cni-node"
)

// DefaultPodCIDR is the pod range when Options.PodCIDR is zero.
var DefaultPodCIDR = netip.MustParsePrefix("10.244.0.0/24")

// PauseImage is the sandbox image Up builds and imports.
const PauseImage = "istio-cni.local/pause:v1"

// Node is a running single-node cluster. Call Down when done.
type Node struct {
	opts     Options
	l        layout
	progress io.Writer
	root     string // repository root
	tools    string // directory of the built hack/node/tools
	runtime  string // directory of containerd, its shim, ctr and runc
	host     *hostBefore

	launcher   *childproc.Launcher
	cp         *controlplane.ControlPlane
	containerd *childproc.Process
	kubelet    *childproc.Process
	scheduler  *childproc.Process
	kcm        *childproc.Process
	kubeProxy  *childproc.Process
	// proxyHealthz is kube-proxy's healthz port on 127.0.0.1.
	proxyHealthz int
	client       kubernetes.Interface
	kubeconfig   string
	versions     Versions
	// kubeBin and kubeletCAFile are what Reboot needs to start kubelet and
	// kube-proxy again.
	kubeBin, kubeletCAFile string

	upDur    time.Duration
	downOnce sync.Once
	downErr  error
	downDur  time.Duration
}

// Kubeconfig is the path of an admin (system:masters) kubeconfig for the cluster.
func (n *Node) Kubeconfig() string { return n.kubeconfig }

// ToolEnv is the environment for command-line tools run against the node
// (kubectl, helm): the admin kubeconfig, and their caches and config under the
// state dir rather than the user's home (~/.kube/cache, ~/.cache/helm), so Down
// removes them too.
func (n *Node) ToolEnv() []string {
	return []string{
		"KUBECONFIG=" + n.kubeconfig,
		"KUBECACHEDIR=" + n.l.path("tools", "kube-cache"),
		"HELM_CACHE_HOME=" + n.l.path("tools", "helm-cache"),
		"HELM_CONFIG_HOME=" + n.l.path("tools", "helm-config"),
		"HELM_DATA_HOME=" + n.l.path("tools", "helm-data"),
	}
}

// Client is an admin clientset.
func (n *Node) Client() kubernetes.Interface { return n.client }

// Name is the Node object's name.
func (n *Node) Name() string { return n.opts.NodeName }

// PodCIDR is the range pod addresses come from.
func (n *Node) PodCIDR() netip.Prefix { return n.opts.PodCIDR }

// StateDir is where everything of the node lives; Down removes it.
func (n *Node) StateDir() string { return n.l.state }

// CNIBinDir and CNIConfDir are containerd's CNI directories (ours, not /opt/cni/bin
// and /etc/cni/net.d). The primary network's config is 10-ptp.conflist.
func (n *Node) CNIBinDir() string  { return n.l.cniBinDir() }
func (n *Node) CNIConfDir() string { return n.l.cniConfDir() }

// StaticPodDir is the kubelet's staticPodPath: a pod manifest written there runs
// as a static pod, which the kubelet mirrors into the API server.
func (n *Node) StaticPodDir() string { return n.l.staticPods() }

// ContainerdSocket is the path of containerd's gRPC socket (the CRI endpoint).
func (n *Node) ContainerdSocket() string { return n.l.containerdSocket() }

// Ctr is the path of the ctr that matches the node's containerd.
func (n *Node) Ctr() string { return filepath.Join(n.runtime, "ctr") }

// Versions says what the node runs: kubelet's and containerd's own version
// strings (filled in by Up).
func (n *Node) Versions() Versions { return n.versions }

// Versions are the node's component versions as each reports it.
type Versions struct {
	Kubelet, Containerd, Runc string
}

// UpDuration is how long Up took, first-run builds included.
func (n *Node) UpDuration() time.Duration { return n.upDur }

// DownDuration is how long Down took (zero before Down).
func (n *Node) DownDuration() time.Duration { return n.downDur }

// LogDir holds the servers' logs (gone after Down).
func (n *Node) LogDir() string { return n.l.logDir() }

func (n *Node) step(format string, args ...any) {
	fmt.Fprintf(n.progress, "node: "+format+"\n", args...)
}

// Up starts the cluster and returns once the node is Ready and schedulable. On
// failure it undoes what it did.
func Up(ctx context.Context, opts Options) (_ *Node, err error) {
	began := time.Now()
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	if opts.NodeName == "" {
		opts.NodeName = DefaultNodeName
	}
	if !opts.PodCIDR.IsValid() {
		opts.PodCIDR = DefaultPodCIDR
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Minute
	}
	n := &Node{opts: opts, progress: opts.Progress, l: layout{state: filepath.Clean(opts.StateDir)}}
	if n.progress == nil {
		n.progress = os.Stderr
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("node: must run as root (containerd, kubelet, network namespaces)")
	}
	for _, tool := range []string{"iptables", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("node: %s not found in PATH: install it (hack/install-deps.sh does it)", tool)
		}
	}
	if entries, err := os.ReadDir(n.l.state); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("node: state dir %s is not empty: is a node up? (hack/node/down.sh, or Cleanup, removes a stale one)", n.l.state)
	}
	if n.root, err = repo.Root(); err != nil {
		return nil, err
	}

	// Builds come first and outside the timeout: a first run compiles for minutes.
	kubeBin := opts.KubeBinDir
	if kubeBin == "" {
		if kubeBin, err = n.script(ctx, "hack/kube-binaries.sh", "etcd", "kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy"); err != nil {
			return nil, err
		}
	}
	pluginDir := opts.CNIPluginDir
	if pluginDir == "" {
		if pluginDir, err = n.script(ctx, "hack/cni-plugins.sh"); err != nil {
			return nil, err
		}
	}
	n.runtime = opts.RuntimeBinDir
	if n.runtime == "" {
		if n.runtime, err = n.script(ctx, "hack/runtime-binaries.sh"); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if _, err := os.Stat(filepath.Join(n.runtime, b)); err != nil {
			return nil, fmt.Errorf("node: %s: %w (hack/runtime-binaries.sh builds it)", b, err)
		}
	}
	if n.versions, err = componentVersions(ctx, kubeBin, n.runtime); err != nil {
		return nil, err
	}
	n.step("kubelet %s, containerd %s, runc %s", n.versions.Kubelet, n.versions.Containerd, n.versions.Runc)
	if !opts.NodeIP.IsValid() {
		if opts.NodeIP, err = controlplane.NonLoopbackIPv4(); err != nil {
			return nil, fmt.Errorf("node: %w; set Options.NodeIP", err)
		}
		n.opts.NodeIP = opts.NodeIP
	}

	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	n.host = snapshotHost()
	for t, existed := range n.host.NftTables {
		if existed {
			// Down would leave it, but the two kube-proxies would fight over it.
			return nil, fmt.Errorf("node: this host already has the nftables table %s: a kube-proxy runs here; a node cannot run its own", t)
		}
	}
	n.launcher = childproc.NewLauncher()
	if err := os.MkdirAll(n.l.state, 0o755); err != nil {
		return nil, fmt.Errorf("node: create %s: %w", n.l.state, err)
	}
	if err := saveHost(n.l.hostSnapshot(), n.host); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if downErr := n.Down(); downErr != nil {
				err = fmt.Errorf("%w (and taking the node down: %v)", err, downErr)
			}
		}
	}()
	for _, d := range []string{n.l.state, n.l.logDir(), n.l.cniBinDir(), n.l.cniConfDir(), n.l.kubeletRoot(), n.l.podLogs(), n.l.staticPods(), n.l.imagesDir(), n.l.kubeconfigDir(), n.l.path("containerd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node: create %s: %w", d, err)
		}
	}

	t := time.Now()
	if err := n.buildTools(ctx); err != nil {
		return nil, err
	}
	n.step("helper tools ready (%s)", since(t))

	if err := installPlugins(pluginDir, n.l.cniBinDir()); err != nil {
		return nil, err
	}
	conflist, err := ptpConflist(n.l, opts.PodCIDR, opts.PodCIDRv6)
	if err != nil {
		return nil, err
	}
	if opts.PodCIDRv6.IsValid() {
		for _, s := range []struct{ name, value string }{
			{"net/core/devconf_inherit_init_net", "1"},
			{"net/ipv6/conf/default/accept_dad", "0"},
		} {
			if err := os.WriteFile("/proc/sys/"+s.name, []byte(s.value), 0o644); err != nil {
				return nil, fmt.Errorf("node: dual-stack pods: sysctl %s=%s: %w", s.name, s.value, err)
			}
		}
	}
	if err := writeAtomic(filepath.Join(n.l.cniConfDir(), "10-ptp.conflist"), conflist, 0o644); err != nil {
		return nil, err
	}

	kubeletClient, err := newKubeletClientPKI(n.l.kubeconfigDir())
	if err != nil {
		return nil, err
	}
	t = time.Now()
	n.cp, err = controlplane.Start(ctx, controlplane.Options{
		BinDir:           kubeBin,
		TempDir:          n.l.state,
		AdvertiseAddress: net.IP(opts.NodeIP.AsSlice()),
		// Where the kubernetes Service's endpoint leads: pods and the host reach
		// the API server through its ClusterIP, as in a cluster.
		BindAddress: net.IP(opts.NodeIP.AsSlice()),
		Logger:      discardLogger(),
		ExtraAPIServerArgs: []string{
			"--kubelet-client-certificate=" + kubeletClient.certFile,
			"--kubelet-client-key=" + kubeletClient.keyFile,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n.client = n.cp.AdminClient()
	n.kubeconfig = filepath.Join(n.l.state, "admin.kubeconfig")
	adminKC, err := os.ReadFile(n.cp.AdminKubeconfig())
	if err != nil {
		return nil, fmt.Errorf("node: read admin kubeconfig: %w", err)
	}
	if err := writeAtomic(n.kubeconfig, adminKC, 0o600); err != nil {
		return nil, err
	}
	caFile := filepath.Join(n.l.kubeconfigDir(), "ca.crt")
	if err := writeAtomic(caFile, n.cp.CAData(), 0o644); err != nil {
		return nil, err
	}
	// kubelet trusts the control plane's clients and the apiserver's kubelet client.
	kubeletCAFile := filepath.Join(n.l.kubeconfigDir(), "kubelet-client-ca.crt")
	if err := writeAtomic(kubeletCAFile, append(n.cp.CAData(), kubeletClient.caPEM...), 0o644); err != nil {
		return nil, err
	}
	n.step("etcd and kube-apiserver ready at %s (%s)", n.cp.Host(), since(t))

	t = time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	pause := filepath.Join(n.tools, "pause")
	if err := n.ImportImage(ctx, PauseImage, map[string]string{"/pause": pause}, []string{"/pause"}); err != nil {
		return nil, err
	}
	n.step("containerd ready, pause image imported (%s)", since(t))

	n.kubeBin, n.kubeletCAFile = kubeBin, kubeletCAFile
	t = time.Now()
	if err := n.startControllers(ctx, kubeBin, caFile); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx, kubeBin, kubeletCAFile); err != nil {
		return nil, err
	}
	if err := n.startKubeProxy(kubeBin); err != nil {
		return nil, err
	}
	if err := n.waitReady(ctx, time.Time{}); err != nil {
		return nil, err
	}
	n.step("node %s Ready (%s)", opts.NodeName, since(t))
	n.upDur = time.Since(began)
	n.step("up in %s; export KUBECONFIG=%s", since(began), n.kubeconfig)
	return n, nil
}

// componentVersions asks each binary for its version.
func componentVersions(ctx context.Context, kubeBin, runtimeBin string) (Versions, error) {
	var v Versions
	for _, c := range []struct {
		dst  *string
		bin  string
		args []string
	}{
		{&v.Kubelet, filepath.Join(kubeBin, "kubelet"), []string{"--version"}},
		{&v.Containerd, filepath.Join(runtimeBin, "containerd"), []string{"--version"}},
		{&v.Runc, filepath.Join(runtimeBin, "runc"), []string{"--version"}},
	} {
		out, err := exec.CommandContext(ctx, c.bin, c.args...).Output()
		if err != nil {
			return v, fmt.Errorf("node: %s %s: %w", c.bin, strings.Join(c.args, " "), err)
		}
		// "Kubernetes v1.37.2", "containerd github.com/... v2.4.2 rev", "runc version 1.5.2"
		line := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
		for _, f := range line {
			if len(f) > 1 && (f[0] == 'v' || (f[0] >= '0' && f[0] <= '9')) && strings.Count(f, ".") >= 2 {
				*c.dst = "v" + strings.TrimPrefix(f, "v")
				break
			}
		}
		if *c.dst == "" {
			return v, fmt.Errorf("node: %s %s printed no version: %q", c.bin, strings.Join(c.args, " "), out)
		}
	}
	return v, nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

func (n *Node) startContainerd(ctx context.Context) error {
	if err := writeAtomic(n.l.containerdConfig(), []byte(containerdTOML(n.l, PauseImage, filepath.Join(n.runtime, "runc"))), 0o644); err != nil {
		return err
	}
	var err error
	// containerd finds its shim through PATH: ours first.
	n.containerd, err = n.launcher.Start("containerd", filepath.Join(n.runtime, "containerd"),
		[]string{"--config", n.l.containerdConfig(), "--log-level", "info"},
		[]string{"PATH=" + n.runtime + ":" + os.Getenv("PATH")},
		filepath.Join(n.l.logDir(), "containerd.log"))
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return poll(ctx, n.containerd, "containerd's socket", func() (bool, string) {
		out, err := exec.CommandContext(ctx, n.Ctr(), "-a", n.l.containerdSocket(), "version").CombinedOutput()
		return err == nil, string(out)
	})
}

func (n *Node) startControllers(ctx context.Context, kubeBin, caFile string) error {
	var err error
	if n.scheduler, err = n.startController(kubeBin, "kube-scheduler", "scheduler.kubeconfig", "system:kube-scheduler"); err != nil {
		return err
	}
	n.kcm, err = n.startController(kubeBin, "kube-controller-manager", "controller-manager.kubeconfig", "system:kube-controller-manager",
		// Each controller with its own ServiceAccount and the RBAC the apiserver
		// bootstraps for it, tokens from the TokenRequest API.
		"--use-service-account-credentials=true",
		"--root-ca-file="+caFile,
		"--service-cluster-ip-range="+controlplane.ServiceClusterIPRange,
		"--allocate-node-cidrs=false",
		// The not-ready taint goes as soon as the node is Ready, not up to 5s later.
		"--node-monitor-period=1s",
		// Pods get tokens from the TokenRequest API; Secret-based tokens are not
		// needed, and their controller would need the signing key.
		"--controllers=*,-serviceaccount-token",
	)
	return err
}

// startController starts a control plane controller as user, with a client
// certificate in the kubeconfig file kubeconfig, no leader election and no serving
// port (nothing scrapes it, and a fixed one would collide with another node or test
// on the same machine), and the flags in extra.
func (n *Node) startController(kubeBin, name, kubeconfig, user string, extra ...string) (*childproc.Process, error) {
	kc, err := n.cp.ClientCertKubeconfig(filepath.Join(n.l.kubeconfigDir(), kubeconfig), user, nil)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	args := append([]string{"--kubeconfig=" + kc, "--leader-elect=false", "--secure-port=0"}, extra...)
	p, err := n.launcher.Start(name, filepath.Join(kubeBin, name), args, nil, filepath.Join(n.l.logDir(), name+".log"))
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	return p, nil
}

func (n *Node) startKubelet(ctx context.Context, kubeBin, caFile string) error {
	kc, err := n.cp.ClientCertKubeconfig(filepath.Join(n.l.kubeconfigDir(), "kubelet.kubeconfig"),
		"system:node:"+n.opts.NodeName, []string{"system:nodes"})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	kubeletConf := kubeletYAML(n.l, n.opts.NodeIP, ports[0], ports[1], caFile)
	if n.opts.MaxPods > 0 {
		kubeletConf += fmt.Sprintf("maxPods: %d\n", n.opts.MaxPods)
	}
	if err := writeAtomic(n.l.kubeletConfig(), []byte(kubeletConf), 0o644); err != nil {
		return err
	}
	n.kubelet, err = n.launcher.Start("kubelet", filepath.Join(kubeBin, "kubelet"), []string{
		"--config=" + n.l.kubeletConfig(),
		"--kubeconfig=" + kc,
		"--hostname-override=" + n.opts.NodeName,
		"--node-ip=" + n.opts.NodeIP.String(),
		"--root-dir=" + n.l.kubeletRoot(),
		// Its default is /var/lib/kubelet/pki whatever --root-dir says.
		"--cert-dir=" + n.l.path("kubelet", "pki"),
		"--v=1",
	}, nil, filepath.Join(n.l.logDir(), "kubelet.log"))
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// startKubeProxy runs kube-proxy in nftables mode: Services' ClusterIPs work from
// pods and from the host, as in a cluster (the kubernetes Service that
// KUBERNETES_SERVICE_HOST names among them). Its rules live in its own nftables
// tables, which Down removes (see kubeProxyTables).
func (n *Node) startKubeProxy(kubeBin string) error {
	kc, err := n.cp.ClientCertKubeconfig(filepath.Join(n.l.kubeconfigDir(), "kube-proxy.kubeconfig"), "system:kube-proxy", nil)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.proxyHealthz = ports[0]
	cfg := n.l.path("kube-proxy.yaml")
	if err := writeAtomic(cfg, []byte(kubeProxyYAML(kc, n.opts.NodeName, n.opts.PodCIDR, ports[0], ports[1])), 0o644); err != nil {
		return err
	}
	n.kubeProxy, err = n.launcher.Start("kube-proxy", filepath.Join(kubeBin, "kube-proxy"),
		[]string{"--config=" + cfg, "--v=1"}, nil, filepath.Join(n.l.logDir(), "kube-proxy.log"))
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// waitReady waits for the node to be Ready without NoSchedule taints, for
// kube-proxy to have programmed the Services, and for the controller-manager to
// have published the CA config map pods' token volumes need. A non-zero since
// also wants the kubelet's Ready condition posted at or after it (the API keeps
// the last status of a kubelet that has since stopped).
func (n *Node) waitReady(ctx context.Context, since time.Time) error {
	ready := func() (bool, string) {
		for _, p := range []*childproc.Process{n.kubelet, n.scheduler, n.kcm, n.containerd, n.kubeProxy} {
			if !p.Running() {
				return false, p.ExitError().Error()
			}
		}
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				return false, fmt.Sprintf("node %s: Ready=%s: %s", node.Name, c.Status, c.Message)
			}
			// Heartbeats have a resolution of a second.
			if c.Type == corev1.NodeReady && c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
				return false, fmt.Sprintf("node %s: Ready, but posted at %s, before the kubelet's start", node.Name, c.LastHeartbeatTime.Time)
			}
		}
		for _, t := range node.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				return false, fmt.Sprintf("node %s: taint %s", node.Name, t.ToString())
			}
		}
		if _, err := n.client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			return false, "config map default/kube-root-ca.crt: " + err.Error()
		}
		if ok, why := n.kubeProxyHealthy(ctx); !ok {
			return false, why
		}
		return true, ""
	}
	return poll(ctx, n.kubelet, "node Ready", ready)
}

// poll calls check every 100ms until it is done, p exits, or ctx ends.
func poll(ctx context.Context, p *childproc.Process, what string, check func() (bool, string)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := check()
		if ok {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("node: waiting for %s: %w", what, p.ExitError())
		case <-ctx.Done():
			return fmt.Errorf("node: waiting for %s: %w (last: %s); last lines of %s:\n%s",
				what, ctx.Err(), strings.TrimSpace(last), p.LogPath, p.Tail(20))
		case <-tick.C:
		}
	}
}

// script runs a build script of the repository and returns the directory it prints
// last; its progress goes to n.progress.
func (n *Node) script(ctx context.Context, script string, args ...string) (string, error) {
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(n.root, script), args...)
	cmd.Dir = n.root
	cmd.Stdout = &stdout
	cmd.Stderr = n.progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("node: run %s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", fmt.Errorf("node: %s printed no directory", script)
	}
	return dir, nil
}

func installPlugins(from, to string) error {
	for _, name := range []string{"ptp", "host-local", "loopback", "bridge", "portmap"} {
		data, err := os.ReadFile(filepath.Join(from, name))
		if err != nil {
			return fmt.Errorf("node: CNI plugin %s: %w (build with hack/cni-plugins.sh)", name, err)
		}
		if err := writeAtomic(filepath.Join(to, name), data, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic writes through a rename so a reader (containerd watching its CNI conf
// dir, for one) never sees half a file.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return fmt.Errorf("node: write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, perm); err != nil {
		return fmt.Errorf("node: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("node: write %s: %w", path, err)
	}
	return nil
}

// kubeProxyHealthy is kube-proxy's own healthz: 200 once it has synced the rules.
func (n *Node) kubeProxyHealthy(ctx context.Context) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/healthz", n.proxyHealthz), nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, "kube-proxy healthz: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("kube-proxy healthz: %s: %s", resp.Status, body)
	}
	return true, ""
}
