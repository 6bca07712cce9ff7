package doctor

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/istioiptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/repair"
)

// Exit codes of the node-side commands.
const (
	exitOK        = 0
	exitProblem   = 1 // a difference, a problem or an error
	exitUsage     = 2
	exitNotMeshed = 3 // the plugin does not redirect the pod, and nothing is wrong
)

// nodeFlags are the flags inspect and probe share.
type nodeFlags struct {
	kubeconfig, config, confDir, binDir, nodeName, procDir, netnsDirs, output *string
	timeout                                                                   *time.Duration
}

func addNodeFlags(fs *flag.FlagSet) *nodeFlags {
	return &nodeFlags{
		kubeconfig: fs.String("kubeconfig", "", "kubeconfig to read the pod with (default: the agent's <cni_agent_run_dir>/istio-cni-kubeconfig, else in-cluster)"),
		config:     fs.String("config", "", "the plugin's config file: an istio-cni entry, .conf or .conflist (default: found in --conf-dir)"),
		confDir:    fs.String("conf-dir", DefaultConfDir(), "the node's CNI config directory, searched for the istio-cni entry (OpenShift: /etc/cni/multus/net.d)"),
		binDir:     fs.String("bin-dir", DefaultBinDir(), "the node's CNI bin directory, checked for the istio-cni binary (OpenShift: /var/lib/cni/bin; empty: not checked)"),
		nodeName:   fs.String("node-name", DefaultNodeName(), "this node's name (default: NODE_NAME, else the host name)"),
		procDir:    fs.String("proc-dir", DefaultFinder().ProcDir, "the node's /proc, searched for the pod's network namespace"),
		netnsDirs:  fs.String("netns-dirs", strings.Join(DefaultFinder().Dirs, ","), "comma-separated directories of bind-mounted network namespaces"),
		output:     fs.String("o", "text", `output format: "text" or "json"`),
		timeout:    fs.Duration("timeout", 30*time.Second, "give up after this long"),
	}
}

func (f *nodeFlags) node() *Node {
	finder := &repair.ProcFinder{ProcDir: *f.procDir}
	for _, d := range strings.Split(*f.netnsDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			finder.Dirs = append(finder.Dirs, d)
		}
	}
	return &Node{Name: *f.nodeName, Kubeconfig: *f.kubeconfig, ConfigFile: *f.config, ConfDir: *f.confDir, BinDir: *f.binDir, Finder: finder}
}

// parseNodeArgs parses flags and the one NAMESPACE/POD argument, which may come
// before or after the flags.
func parseNodeArgs(cmd string, args []string, stderr io.Writer, extra func(fs *flag.FlagSet)) (*nodeFlags, string, string, bool) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	nf := addNodeFlags(fs)
	if extra != nil {
		extra(fs)
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, "", "", false
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "%s: want exactly one NAMESPACE/POD argument, got %d\n", cmd, len(pos))
		return nil, "", "", false
	}
	ns, name, err := ParsePodRef(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return nil, "", "", false
	}
	if *nf.output != "text" && *nf.output != "json" {
		fmt.Fprintf(stderr, "%s: -o %q: want text or json\n", cmd, *nf.output)
		return nil, "", "", false
	}
	return nf, ns, name, true
}

// target is a pod on this node with everything needed to look at it.
type target struct {
	cfg      *plugin.Config
	src      ConfigSource
	client   *kube.Client
	pod      *kube.Pod
	podNS    *kube.Namespace // nil unless the plugin's decision needs it
	multus   *MultusCheck
	problems []string
	ns       *repair.Netns
}

// resolve reads the config and the pod, checks the node's side (binary, Multus)
// and finds the pod's namespace. The caller closes t.ns.
func resolve(ctx context.Context, n *Node, namespace, name string) (*target, error) {
	t := &target{}
	var err error
	if t.cfg, t.src, err = n.PluginConfig(); err != nil {
		return nil, err
	}
	if t.client, _, err = n.Client(t.cfg); err != nil {
		return nil, err
	}
	if t.pod, err = n.GetPod(ctx, t.client, namespace, name); err != nil {
		return nil, err
	}
	if t.podNS, err = n.PodNamespace(ctx, t.client, t.cfg, t.pod); err != nil {
		return nil, err
	}
	if n.BinDir != "" {
		bin := filepath.Join(n.BinDir, PluginType)
		if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 || fi.IsDir() {
			t.problems = append(t.problems, fmt.Sprintf("the plugin binary %s is missing or not executable: the runtime fails every ADD "+
				"(\"failed to find plugin istio-cni\") and pods stay in ContainerCreating; the agent installs it when it starts", bin))
		}
	}
	if _, annotated := t.pod.Metadata.Annotations[MultusNetworksAnnotation]; annotated || t.src.Layout == LayoutStandalone {
		network := t.cfg.Name
		if network == "" {
			network = PluginType
		}
		t.multus = CheckMultus(ctx, t.client, t.pod, network)
	}
	if t.ns, err = n.FindNetns(ctx, t.pod); err != nil {
		return nil, err
	}
	return t, nil
}

func inspectCmd(args []string, stdout, stderr io.Writer) int {
	nf, namespace, name, ok := parseNodeArgs("inspect", args, stderr, nil)
	if !ok {
		return exitUsage
	}
	return onTarget("inspect", nf, namespace, name, stderr, func(ctx context.Context, t *target) int {
		in, err := Inspect(ctx, t.pod, t.podNS, t.cfg, t.src, t.multus, t.problems, t.ns.Path, t.ns.Source, t.ns.Inode)
		if err != nil {
			fmt.Fprintf(stderr, "inspect: pod %s: %v\n", t.pod.Key(), err)
			return exitProblem
		}
		if err := write(stdout, *nf.output, in, in.Text); err != nil {
			fmt.Fprintf(stderr, "inspect: %v\n", err)
			return exitProblem
		}
		switch in.Status {
		case StatusOK:
			return exitOK
		case StatusNotMeshed:
			return exitNotMeshed
		}
		return exitProblem
	})
}

// onTarget resolves the pod namespace/name on the node nf describes, within the
// node flags' timeout, and runs cmd's work on it; it prints cmd's failure to
// resolve and closes the pod's namespace after run.
func onTarget(cmd string, nf *nodeFlags, namespace, name string, stderr io.Writer, run func(ctx context.Context, t *target) int) int {
	ctx, cancel := context.WithTimeout(context.Background(), *nf.timeout)
	defer cancel()
	t, err := resolve(ctx, nf.node(), namespace, name)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitProblem
	}
	defer t.ns.Close()
	return run(ctx, t)
}

func write(w io.Writer, format string, v any, text func() string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	_, err := io.WriteString(w, text())
	return err
}

func probeCmd(args []string, stdout, stderr io.Writer) int {
	var appUID *uint
	var target4, target6 *string
	var probePort *uint
	var perConn *time.Duration
	var named func() bool
	nf, namespace, name, ok := parseNodeArgs("probe", args, stderr, func(fs *flag.FlagSet) {
		appUID = fs.Uint("app-uid", 0, "uid (and gid) of the outbound probe: an application's (default: the app container's runAsUser unless the capture exempts it as the proxy's, else 1000)")
		target4 = fs.String("outbound-target", DefaultOutboundV4.String(), "IPv4 address:port the outbound probe connects to (default: this one when the pod's settings capture it, else one they capture)")
		target6 = fs.String("outbound-target6", DefaultOutboundV6.String(), "IPv6 address:port of the outbound probe (IPv6 pods)")
		probePort = fs.Uint("probe-port", istioiptables.DefaultProbePort, "the validation's probe port (istio-validation's --probe-port)")
		perConn = fs.Duration("connect-timeout", 2*time.Second, "how long each test connection may take")
		named = func() bool {
			given := false
			fs.Visit(func(f *flag.Flag) { given = given || f.Name == "outbound-target" || f.Name == "outbound-target6" })
			return given
		}
	})
	namedOutbound := ok && named()
	if !ok {
		return exitUsage
	}
	o := ProbeOptions{AppUID: uint32(*appUID), ProbePort: uint16(*probePort), Timeout: *perConn}
	var err error
	if o.OutboundV4, err = netip.ParseAddrPort(*target4); err == nil && !o.OutboundV4.Addr().Is4() {
		err = fmt.Errorf("%s is not IPv4", *target4)
	}
	if err == nil {
		if o.OutboundV6, err = netip.ParseAddrPort(*target6); err == nil && !o.OutboundV6.Addr().Is6() {
			err = fmt.Errorf("%s is not IPv6", *target6)
		}
	}
	if err != nil || *probePort == 0 || *probePort > 65535 {
		fmt.Fprintf(stderr, "probe: bad flag: %v\n", err)
		return exitUsage
	}
	o.OutboundNamed = namedOutbound
	return onTarget("probe", nf, namespace, name, stderr, func(ctx context.Context, t *target) int {
		pp, err := plugin.PlanFor(plugin.ArgsFor(t.pod), t.cfg, t.pod, t.podNS, sandboxOf(t.pod, t.ns.Path, t.src.Layout))
		if err != nil {
			fmt.Fprintf(stderr, "probe: %v\n", err)
			return exitProblem
		}
		if pp.Spec == nil {
			// Nothing would capture its traffic, so there is no capture to probe;
			// `inspect` shows that the namespace holds none of our rules.
			fmt.Fprintf(stderr, "probe: pod %s is not captured by the plugin (%s); use inspect to check it holds no rules\n", t.pod.Key(), pp.Decision.Reason)
			return exitProblem
		}
		spec := *pp.Spec
		if *appUID == 0 {
			o.AppUID = defaultAppUID(t.pod, spec)
		}
		o.Proc = t.ns.Proc
		res, err := Probe(ctx, t.pod.Key(), t.ns.Path, t.ns.Source, spec, o)
		if err != nil {
			fmt.Fprintf(stderr, "probe: %v\n", err)
			return exitProblem
		}
		if err := write(stdout, *nf.output, res, res.Text); err != nil {
			fmt.Fprintf(stderr, "probe: %v\n", err)
			return exitProblem
		}
		if !res.Redirected {
			return exitProblem
		}
		return exitOK
	})
}

// defaultAppUID is the uid the pod's first application container runs as, when it is set
// and its traffic is captured (it is not one of spec's proxy uids or gids, which the
// plugin decides: the probe runs as it with the same gid); else 1000.
func defaultAppUID(pod *kube.Pod, spec redirect.Spec) uint32 {
	for _, c := range pod.Spec.Containers {
		if c.Name == plugin.ContainerIstioProxy {
			continue
		}
		if u, _ := c.RunAs(pod.Spec.SecurityContext); u != nil && *u > 0 && *u < 1<<32 &&
			!slices.Contains(spec.ProxyUIDs, uint32(*u)) && !slices.Contains(spec.ProxyGIDs, uint32(*u)) {
			return uint32(*u)
		}
		break
	}
	return 1000
}
