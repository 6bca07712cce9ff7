package plugin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// Plugin runs the CNI commands. Its fields are the process's surroundings, so tests
// can run it in-process; main fills them from the real process.
type Plugin struct {
	// Stdout receives the CNI result and nothing else.
	Stdout io.Writer
	// Stderr receives logs.
	Stderr io.Writer
	// Timeout bounds a whole command (the runtime also has its own).
	Timeout time.Duration
	// Started is when the process reached main; the ADD's logged phases begin there
	// (zero: when Add is called).
	Started time.Time
	// StartErr is a failure of the process's start that changed nothing a command
	// depends on (the timer slack's: package timerslack/widen); every command logs
	// it at debug, so that a node where it fails can be told from one where it
	// does not.
	StartErr error
}

// New returns the plugin as the runtime runs it.
func New() *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr, Timeout: 2 * time.Minute, Started: time.Now()}
}

// Funcs wires the plugin into cnicmd.Main.
func (p *Plugin) Funcs() cnicmd.Funcs {
	return cnicmd.Funcs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC, Refused: p.refused}
}

// refused tells the log and the agent of an ADD that the dispatch refused before
// Add ran (cnicmd.Funcs.Refused): such an ADD fails as every other does, and the
// agent counts it (istio_cni_plugin_add_failures_total), by reason config, or
// environment for a CNI_NETNS that is the plugin's own namespace. A DEL refused
// so succeeds without running (cnicmd.Run: its ADD was refused the same way) and
// is logged at debug, as DEL's other "nothing to do" outcomes. Other commands are
// refused with the runtime's error alone, as before.
func (p *Plugin) refused(cmd string, args *cnicmd.CmdArgs, cerr *types.Error) {
	if cmd != "ADD" && cmd != "DEL" {
		return
	}
	reason := pluginlog.ReasonConfig
	if cerr.Code == types.ErrInvalidEnvironmentVariables {
		reason = pluginlog.ReasonEnvironment
	}
	var log *pluginlog.Logger
	if cfg, err := ParseConfig(args.StdinData); err == nil {
		log = pluginlog.New(p.Stderr, cfg.logOptions())
	} else {
		log = pluginlog.New(p.Stderr, invalidConfigLogOptions(args.StdinData))
	}
	if cmd == "DEL" {
		log.Debug("DEL: nothing to do: the ADD of this config or namespace is refused the same way", "command", cmd,
			"containerID", shortID(args.ContainerID), "netns", args.Netns, "refusal", cerr.Error(), "code", cerr.Code)
		log.Close()
		return
	}
	log.Error("ADD failed", "command", cmd, "containerID", shortID(args.ContainerID), "netns", args.Netns,
		"error", cerr.Msg, "details", cerr.Details, "code", cerr.Code, "reason", reason)
	ev := pluginlog.Event{Command: cmd, Outcome: pluginlog.OutcomeFailed, Reason: reason}
	if !p.Started.IsZero() {
		ev.Seconds = time.Since(p.Started).Seconds()
	}
	log.Report(ev)
	log.Close()
}

// PodCacheSocketName is the node agent's pod cache socket in its run directory (see
// package podcache, which serves it).
const PodCacheSocketName = "pods.sock"

// SupportedVersions are the CNI spec versions the plugin speaks, the ones
// test/e2e runs a chain with: 0.3.0 and later, whose results name interfaces and
// carry IPv6. A config of 0.1.0 or 0.2.0 is refused by name (the runtime reports
// "incompatible CNI versions") rather than half understood.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// cniError turns err into a CNI error with code, keeping a message a person can act
// on. Errors that already are CNI errors keep their code; one marked with a code
// of its own (withCode) gets that code, with err's whole message.
func cniError(code uint, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	var coded *codedError
	if errors.As(err, &coded) {
		code = coded.code
	}
	return types.NewError(code, err.Error(), "")
}

// recorder starts a command's phases: at main when the process noted it, whose
// first phase, up to now, is cnicmd's reading of the environment and stdin.
func (p *Plugin) recorder() *timing.Recorder {
	if p.Started.IsZero() {
		return timing.Start()
	}
	rec := timing.StartAt(p.Started)
	rec.Mark("stdin")
	return rec
}

// setup parses the config and opens the logger. The logger must be closed. rec,
// when not nil, gets the two as phases.
func (p *Plugin) setup(args *cnicmd.CmdArgs, command string, rec *timing.Recorder) (*Config, *pluginlog.Logger, error) {
	cfg, err := ParseConfig(args.StdinData)
	rec.Mark("config")
	if err != nil {
		// The agent hears of it too (its log, and the ADD's failure counted as
		// reason config): its sockets are where what decodes of the config says.
		l := pluginlog.New(p.Stderr, invalidConfigLogOptions(args.StdinData))
		l.Error("invalid plugin config", "command", command, "containerID", args.ContainerID, "error", err)
		return nil, l, cniError(ConfigErrorCode(err), err)
	}
	l := pluginlog.New(p.Stderr, cfg.logOptions())
	l.Logger = l.With("command", command, "containerID", shortID(args.ContainerID), "netns", args.Netns)
	if p.StartErr != nil {
		l.Debug("at the process's start", "error", p.StartErr)
	}
	rec.Mark("log-open")
	return cfg, l, nil
}

// logOptions are the log's options the config names.
func (c *Config) logOptions() pluginlog.Options {
	return pluginlog.Options{Level: c.LogLevel.Slog(), File: c.LogFile, Socket: c.LogSocket, JSON: c.LogJSON,
		DatagramSocket: filepath.Join(c.AgentRunDir, DatagramLogSocketName), IstioSocket: filepath.Join(c.AgentRunDir, IstioLogSocketName)}
}

// invalidConfigLogOptions are the log's options for a config that does not parse:
// the agent's sockets in its run directory and at its log socket as far as those
// keys decode as absolute paths (the rest of the config may be of any shape, or no
// JSON at all), else the defaults; no log file, whose path may be as wrong as the
// rest. At info level.
func invalidConfigLogOptions(data []byte) pluginlog.Options {
	runDir, sock := invalidConfigPaths(data)
	return pluginlog.Options{Socket: sock, DatagramSocket: filepath.Join(runDir, DatagramLogSocketName),
		IstioSocket: filepath.Join(runDir, IstioLogSocketName)}
}

// invalidConfigPaths are the run directory and the agent's log socket of a config
// that does not parse, as invalidConfigLogOptions takes them.
func invalidConfigPaths(data []byte) (runDir, logSocket string) {
	var r struct {
		RunDir        any `json:"cni_agent_run_dir"`
		LogSocket     any `json:"log_socket"`
		LogUDSAddress any `json:"log_uds_address"`
	}
	_ = json.Unmarshal(data, &r) // what does not decode stays nil
	abs := func(v any) (string, bool) {
		s, ok := v.(string)
		return s, ok && filepath.IsAbs(s)
	}
	runDir, ok := abs(r.RunDir)
	if !ok {
		runDir = DefaultAgentRunDir
	}
	sock := filepath.Join(runDir, LogSocketName)
	if s, ok := abs(r.LogSocket); ok {
		sock = s
	} else if s, ok := abs(r.LogUDSAddress); ok && r.LogSocket == nil {
		sock = s
	}
	return runDir, sock
}

// withConfig runs a command's work with the config and its log, closing the log
// after; a config that does not parse fails the command (setup says how) before
// any work.
func (p *Plugin) withConfig(args *cnicmd.CmdArgs, command string, work func(cfg *Config, log *pluginlog.Logger) error) error {
	cfg, log, err := p.setup(args, command, nil)
	defer log.Close()
	if err != nil {
		return err
	}
	return work(cfg, log)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// result is what ADD prints: the previous plugin's result unchanged when chained, an
// empty result of the config's version when standalone (Multus/OpenShift).
func result(cfg *Config) (types.Result, error) {
	if err := cfg.ParsePrevResult(); err != nil {
		return nil, cniError(types.ErrDecodingFailure, err)
	}
	if cfg.PrevResult == nil {
		return &types100.Result{CNIVersion: types100.ImplementedSpecVersion}, nil
	}
	return cfg.PrevResult, nil
}

// print writes r, a result the CNI library parsed or built, in the config's
// version (printResult writes a previous result of that version as given).
func (p *Plugin) print(cfg *Config, r types.Result) error {
	cniVersion := cfg.CNIVersion
	if cniVersion == "" {
		cniVersion = types100.ImplementedSpecVersion
	}
	out, err := r.GetAsVersion(cniVersion)
	if err != nil {
		return cniError(types.ErrIncompatibleCNIVersion, fmt.Errorf("convert result to %s: %w", cniVersion, err))
	}
	return out.PrintTo(p.Stdout)
}

// Add programs the pod's redirection, or passes the pod through, and prints the
// previous result. It never reports success for a pod that needs redirection and
// did not get it: a failed lookup or apply fails the ADD (fail closed).
func (p *Plugin) Add(args *cnicmd.CmdArgs) (err error) {
	start := time.Now()
	rec := p.recorder()
	cfg, log, err := p.setup(args, "ADD", rec)
	// The agent's metrics get the ADD's outcome and run time: one message, sent
	// after the work; what the run waits for the agent is bounded by
	// pluginlog.SendBound.
	ev := pluginlog.Event{Command: "ADD", Reason: pluginlog.ReasonConfig}
	defer func() {
		ev.Seconds = time.Since(start).Seconds()
		if err != nil {
			ev.Outcome = pluginlog.OutcomeFailed
		} else {
			ev.Reason = ""
		}
		log.Report(ev)
		log.Close()
	}()
	if err != nil {
		return err
	}
	// failed logs the ADD's failure at the step reason (err, with its phases and
	// the process's figures) and returns ret, what the runtime gets.
	failed := func(reason string, err, ret error) error {
		ev.Reason = reason
		log.Error("ADD failed", "error", err, "reason", reason, "phases", rec, processUsage())
		return ret
	}
	ctx, cancel := context.WithTimeout(timing.With(context.Background(), rec), p.Timeout)
	defer cancel()
	podArgs, pre, err := decideWithoutPod(ctx, args, cfg, log)
	if err != nil {
		reason, err := failedStep(err)
		return failed(reason, err, err)
	}
	if pre.Verdict == Skip {
		// Passed through before any lookup (an excluded namespace, no Kubernetes
		// arguments): the previous result is printed back as given when it is of
		// the config's version, without parsing it (printResult). One of another
		// version is parsed first, so that an ADD failing on it is told as such.
		if _, given := cfg.givenResult(); !given {
			if _, err := result(cfg); err != nil {
				return failed(pluginlog.ReasonPrevResult, err, err)
			}
		}
		ev.Reason = pluginlog.ReasonOutput
		ev.Outcome = pluginlog.OutcomePassedThrough
		log.Info("ADD: pod passed through", "decision", pre.Rule, "reason", pre.Reason, "took", time.Since(start), "phases", rec, processUsage())
		logPeakMemory(log)
		return p.printResult(cfg)
	}
	ips, err := cfg.PrevResultIPs()
	if err != nil {
		return failed(pluginlog.ReasonPrevResult, err, cniError(types.ErrDecodingFailure, err))
	}
	rec.Mark("prev-result")
	pp, err := p.decide(ctx, cfg, podArgs, args.Netns, log, cfg.PodLookup, ips)
	if err != nil {
		reason, err := failedStep(err)
		return failed(reason, err, err)
	}
	d, plan := pp.Decision, pp.Plan
	warnPodPlan(log.Logger, pp)
	ev.Reason = pluginlog.ReasonOutput
	if d.Verdict != Redirect {
		ev.Outcome = pluginlog.OutcomePassedThrough
		log.Info("ADD: pod passed through", "decision", d.Rule, "reason", d.Reason, "took", time.Since(start), "phases", rec, processUsage())
		logPeakMemory(log)
		return p.printResult(cfg)
	}
	b, err := NewBackend(cfg)
	if err != nil {
		err = fmt.Errorf("pod %s: set up traffic redirection: %w", podArgs.Key(), err)
		return failed(pluginlog.ReasonBackend, err, cniError(types.ErrInternal, err))
	}
	ev.Reason = pluginlog.ReasonApply
	rec.Mark("backend")
	applyStart := time.Now()
	if err := ApplyAndWarn(ctx, log.Logger, args.Netns, b, plan); err != nil {
		err = fmt.Errorf("pod %s: set up traffic redirection: %w", podArgs.Key(), err)
		if gone, ok := netnsGone(args.Netns, err); ok {
			return failed(pluginlog.ReasonNetnsGone, gone, gone)
		}
		return failed(pluginlog.ReasonApply, err, cniError(types.ErrInternal, err))
	}
	ev.Outcome, ev.Reason = pluginlog.OutcomeRedirected, pluginlog.ReasonOutput
	log.Info("ADD: traffic redirected to the sidecar", "decision", d.Rule, "backend", b.Name(),
		"ipv6", plan.Family(redirect.IPv6) != nil, "applyTook", time.Since(applyStart), "took", time.Since(start), "phases", rec, processUsage())
	logPeakMemory(log)
	return p.printResult(cfg)
}

// netnsGone is err as the runtime gets it when the pod's network namespace at
// path is gone (ok), whichever step found out: the CNI error for an invalid
// variable, naming CNI_NETNS as the spec asks of that code. A path that is left
// but is no namespace (its bind mount gone, netns.ErrNotNetNS) is gone too.
func netnsGone(path string, err error) (gone error, ok bool) {
	why := "the network namespace is gone"
	if _, serr := os.Stat(path); serr == nil {
		if !errors.Is(err, netns.ErrNotNetNS) {
			return nil, false
		}
		why = "not a network namespace: its mount is gone, or the path names another file"
	}
	return cniError(types.ErrInvalidEnvironmentVariables, fmt.Errorf("%w (CNI_NETNS %s: %s)", err, path, why)), true
}

// stepError is an error of decide marked with the step that failed (a
// pluginlog.Reason*), for the ADD's metrics; failedStep takes the mark off, so the
// runtime gets the CNI error itself.
type stepError struct {
	reason string
	err    error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func failedAt(reason string, err error) error { return &stepError{reason: reason, err: err} }

func failedStep(err error) (reason string, cause error) {
	if se, ok := err.(*stepError); ok {
		return se.reason, se.err
	}
	return pluginlog.ReasonPodSettings, err
}

// decideWithoutPod reads the pod's CNI arguments and takes the decision that
// needs no lookup: Skip (an excluded namespace, no Kubernetes arguments) or
// Lookup. The log gets the pod's name.
func decideWithoutPod(ctx context.Context, args *cnicmd.CmdArgs, cfg *Config, l *pluginlog.Logger) (PodArgs, Decision, error) {
	podArgs, err := ParsePodArgs(args.Args)
	if err != nil {
		return podArgs, Decision{}, failedAt(pluginlog.ReasonCNIArgs, cniError(types.ErrInvalidEnvironmentVariables, err))
	}
	l.Logger = l.With("pod", podArgs.Key())
	pp, _ := PlanFor(podArgs, cfg, nil, nil, Sandbox{})
	timing.Mark(ctx, "decide")
	return podArgs, pp.Decision, nil
}

// printResult prints ADD's result: the previous result as the runtime gave it
// when it is of the config's version, without parsing it (the runtime checks what
// it reads back; the addresses ADD needs are read by PrevResultIPs), else as
// print converts it; an absent previous result is the empty result of a
// standalone plugin.
func (p *Plugin) printResult(cfg *Config) error {
	if _, ok := cfg.givenResult(); ok {
		_, err := p.Stdout.Write(cfg.prevResult)
		return err
	}
	res, err := result(cfg)
	if err != nil {
		return err
	}
	return p.print(cfg, res)
}

// decide runs the selection for a pod that decideWithoutPod could not decide and,
// for a pod to redirect, builds its plan. It looks the pod up, and its namespace
// only when the namespace decides (RuleNeedNamespace); lookup bounds each lookup's
// retries. The plan's Plan is set only for a pod to redirect whose capture could be
// built.
func (p *Plugin) decide(ctx context.Context, cfg *Config, podArgs PodArgs, netns string, l *pluginlog.Logger, lookup PodLookup, ips []netip.Addr) (PodPlan, error) {
	lookupStart := time.Now()
	pod, err := p.lookup(ctx, cfg, podArgs, l, lookup)
	if err != nil {
		return PodPlan{}, failedAt(pluginlog.ReasonPodLookup, err)
	}
	l.Logger = l.With("lookupTook", time.Since(lookupStart))
	l.Debug("pod found", "prevResultIPs", ips, "podIPs", pod.IPs())
	sb := Sandbox{Addrs: ips, Netns: netns}
	pp, err := PlanFor(podArgs, cfg, pod, nil, sb)
	timing.Mark(ctx, "plan")
	if err == nil && pp.Decision.Rule == RuleNeedNamespace {
		// Only a pod without a sidecar that its own label does not place gets here.
		l.Debug("looking up the namespace", "reason", pp.Decision.Reason)
		nsStart := time.Now()
		ns, nsErr := p.lookupNamespace(ctx, cfg, podArgs, l, lookup)
		if nsErr != nil {
			return PodPlan{}, failedAt(pluginlog.ReasonPodLookup, nsErr)
		}
		l.Logger = l.With("namespaceLookupTook", time.Since(nsStart))
		pp, err = PlanFor(podArgs, cfg, pod, ns, sb)
		timing.Mark(ctx, "plan")
	}
	if errors.Is(err, ErrNetnsUnreadable) {
		// The node's failure, not the pod's settings: counted as an apply in the
		// namespace is, netns_gone when the namespace went away meanwhile.
		if gone, ok := netnsGone(netns, err); ok {
			return PodPlan{Decision: pp.Decision}, failedAt(pluginlog.ReasonNetnsGone, gone)
		}
		return PodPlan{Decision: pp.Decision}, failedAt(pluginlog.ReasonApply, cniError(types.ErrInternal, err))
	}
	if err != nil {
		// The pod's settings are at fault.
		return PodPlan{Decision: pp.Decision}, cniError(types.ErrInvalidNetworkConfig, err)
	}
	return pp, nil
}

// warnPodPlan warns of what the pod's plan holds that may not be what the pod's
// author meant (PodPlan.Warnings has the same in one line each): once per
// variable of the sidecar's that holds no boolean (see envBool), which the
// capture takes as false, as the proxy runs; and once per other container that
// runs as the proxy's uid or gid (see ProxyIdentity), whose traffic bypasses the
// proxy.
func warnPodPlan(log *slog.Logger, pp PodPlan) {
	for _, e := range pp.EnvNotBool {
		log.Warn("ADD: "+EnvNotBoolWarning, "container", e.Container, "variable", e.Name, "value", e.Value)
	}
	for _, s := range pp.SharedProxyID {
		log.Warn("ADD: "+SharedProxyIDWarning, "container", s.Container, s.Kind, s.ID, "from", s.From())
	}
}

// lookup gets the pod, retrying within the configured budget: right after creation a
// pod may not be visible yet, and the API server may be briefly unreachable.
func (p *Plugin) lookup(ctx context.Context, cfg *Config, args PodArgs, log *pluginlog.Logger, budget PodLookup) (*kube.Pod, error) {
	target := lookupTarget[kube.Pod]{
		kind: "pod", errPrefix: "pod " + args.Key(),
		fromAgent: func(ctx context.Context, c *kube.AgentClient) (*kube.Pod, error) {
			return c.GetPod(ctx, args.Namespace, args.Name, args.UID, AgentPodWait)
		},
		fromFile: func(dir string) (*kube.Pod, error) {
			return kube.ReadAgentPodFile(dir, args.Namespace, args.Name)
		},
		path:  kube.PodPath(args.Namespace, args.Name),
		match: args.MatchesPod,
	}
	if args.UID == "" {
		// A runtime that passes no K8S_POD_UID leaves no way to tell the pod
		// from a predecessor of the same name (a StatefulSet's, deleted and
		// recreated): a cache behind the delete, or a killed agent's file, would
		// answer with the predecessor, and its settings (no sidecar, say) would
		// decide for the new pod. Only a quorum read is sure to be the pod
		// that exists now.
		log.Debug("the runtime passed no K8S_POD_UID: the pod is read from the API server, not from a cache")
		target.fromAgent, target.fromFile, target.quorumOnly = nil, nil, true
	}
	return lookupObject(ctx, cfg, log, budget, target)
}

// lookupNamespace gets the pod's namespace, for its labels, within the same bounds
// as the pod's lookup (its own budget, asked only once the pod is found).
func (p *Plugin) lookupNamespace(ctx context.Context, cfg *Config, args PodArgs, log *pluginlog.Logger, budget PodLookup) (*kube.Namespace, error) {
	return lookupObject(ctx, cfg, log, budget, lookupTarget[kube.Namespace]{
		kind: "namespace", errPrefix: fmt.Sprintf("pod %s: namespace %s", args.Key(), args.Namespace),
		fromAgent: func(ctx context.Context, c *kube.AgentClient) (*kube.Namespace, error) {
			return c.GetNamespace(ctx, args.Namespace)
		},
		path: kube.NamespacePath(args.Namespace),
		match: func(ns *kube.Namespace) error {
			if ns.Metadata.Name != args.Namespace {
				return fmt.Errorf("%w: asked for %q, the answer is %q", errOtherNamespace, args.Namespace, ns.Metadata.Name)
			}
			return nil
		},
	})
}

// AgentBound bounds a request to the agent's socket, its wait for the pod aside: a
// wedged agent costs an ADD this much before it asks the API server.
const AgentBound = 200 * time.Millisecond

// AgentPodWait is how long the agent may hold the plugin's request for a pod it
// does not hold yet (podcache.Server): on a node starting many pods at once the
// agent's watch can be the pod's event behind the kubelet's, and the event comes
// sooner than a TLS handshake and a GET to an API server as busy as the node. A
// pod the agent's watch never brings (its watch broken) costs an ADD this much
// more before the API server is asked.
const AgentPodWait = 100 * time.Millisecond

// errOtherNamespace is a looked-up namespace that is not the one asked for.
var errOtherNamespace = errors.New("not the namespace asked for")

// lookupTarget is one object the plugin looks up: from the agent's cache, else from
// the API server at path. match refuses an answer that is not the object wanted.
type lookupTarget[T any] struct {
	kind      string // "pod", "namespace": in logs and errors
	errPrefix string // names the pod (and the object) in errors
	// fromAgent asks the agent's socket (nil: the agent is not asked).
	fromAgent func(context.Context, *kube.AgentClient) (*T, error)
	// fromFile reads the object from the agent's files (pods only; nil: none).
	fromFile func(dir string) (*T, error)
	path     string
	match    func(*T) error
	// quorumOnly: every GET reads etcd, none the API server's watch cache.
	quorumOnly bool
}

// lookupObject gets what target names. The node agent's cache answers in well under
// a millisecond; anything it cannot answer for sure (absent, other UID, no agent)
// goes to the API server, which stays the authority, retried within budget's one
// bound (each request and the waits between them inside it).
func lookupObject[T any](ctx context.Context, cfg *Config, log *pluginlog.Logger, budget PodLookup, target lookupTarget[T]) (*T, error) {
	// The agent first, as an accelerator: its file of the pod (no request, so no
	// wait for the agent to be scheduled; kube.AgentPodFilesDir), then its socket.
	// Either is trusted as the other, and only for this sandbox's object (name and
	// uid); anything else goes on to the API server. A file is read only while a
	// live agent keeps the files (a killed agent's stay on disk unchanged) and only
	// of this build's format (kube.ReadAgentPodFile); else the socket is asked as
	// for a missing file.
	fromAgent := func(phase, where, next string, get func() (*T, error)) (*T, bool) {
		obj, err := get()
		timing.Mark(ctx, target.kind+"-"+phase)
		if err == nil {
			if err = target.match(obj); err == nil {
				log.Debug(target.kind + " found in the agent's " + where)
				return obj, true
			}
		}
		log.Debug("agent's "+where+" could not answer; asking "+next, "object", target.kind, "error", err)
		return nil, false
	}
	if target.fromFile != nil {
		if obj, ok := fromAgent("agent-file", "files", "its socket", func() (*T, error) {
			return target.fromFile(filepath.Join(cfg.AgentRunDir, kube.AgentPodFilesDir))
		}); ok {
			return obj, nil
		}
	}
	if target.fromAgent != nil {
		sock := filepath.Join(cfg.AgentRunDir, PodCacheSocketName)
		if _, err := os.Stat(sock); err == nil {
			if obj, ok := fromAgent("agent-cache", "cache", "the API server", func() (*T, error) {
				return target.fromAgent(ctx, kube.NewAgentClient(sock, AgentBound))
			}); ok {
				return obj, nil
			}
		}
	}
	kc, err := cfg.loadKubeconfig()
	timing.Mark(ctx, "kubeconfig")
	if err != nil {
		return nil, cniError(types.ErrTryAgainLater, fmt.Errorf("%s: cannot look it up: %w", target.errPrefix, err))
	}
	bound := budget.Bound()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	newClient := func(kc *kube.Kubeconfig) (*kube.Client, error) {
		c, err := kube.NewClient(kc, min(PodRequestTimeout, bound))
		if err != nil {
			return nil, err
		}
		c.ResumeSessions(filepath.Join(cfg.AgentRunDir, TLSSessionName), kc)
		return c, nil
	}
	client, err := newClient(kc)
	timing.Mark(ctx, "api-client")
	if err != nil {
		return nil, cniError(types.ErrTryAgainLater, fmt.Errorf("%s: cannot look it up: %w", target.errPrefix, err))
	}
	defer func() {
		resumed, err := client.Resumed()
		log.Logger = log.With(target.kind+"APITLSResumed", resumed, target.kind+"APITLSKeyExchange", client.KeyExchange(),
			target.kind+"APIEncoding", client.Encoding())
		if err != nil {
			log.Debug("the TLS session to the API server was not stored; the next run makes a full handshake", "error", err)
		}
	}()
	start := time.Now()
	gets := 0 // every GET, the cache read included
	var lastErr error
	// The first GET is answered from the API server's watch cache: the same
	// freshness as the agent's cache (itself fed by a watch), at half the cost of a
	// quorum read. An answer that is not the wanted object (not found, another uid)
	// may only be behind: it is asked again at once from etcd, which stays the
	// authority for every later try.
	cached := !target.quorumOnly
	counted := 0 // the tries the budget counts
	for {
		gets++
		obj := new(T)
		path := target.path
		if cached {
			path = kube.FromCache(path)
		}
		err := client.Get(ctx, path, obj)
		timing.Mark(ctx, target.kind+"-api-get")
		if err == nil {
			if err = target.match(obj); err == nil {
				return obj, nil
			}
		}
		lastErr = err
		log.Debug(target.kind+" lookup failed", "get", gets, "fromCache", cached, "error", err)
		if cached && behind(err) {
			// Not counted against the budget: etcd is asked at once.
			cached = false
			continue
		}
		cached = false
		if counted++; counted >= max(1, budget.Retries) {
			break
		}
		wait := time.NewTimer(budget.Interval)
		select {
		case <-ctx.Done():
			wait.Stop()
		case <-wait.C:
		}
		timing.Mark(ctx, target.kind+"-retry-wait")
		if ctx.Err() != nil {
			break
		}
		if credentialsRefused(lastErr) {
			// The agent rewrites the kubeconfig when it renews the token (one that
			// expired while no agent ran, or a deleted agent pod's) or the CA rotates:
			// the next try takes what is there now. Unreadable, the one in hand stays.
			if kc, err := cfg.loadKubeconfig(); err == nil {
				if c, err := newClient(kc); err == nil {
					client = c
				}
			}
		}
	}
	failure := lookupFailure(lastErr, target.kind)
	if tokenRefused(lastErr) {
		// The API server says only "Unauthorized".
		failure += " the token of kubeconfig " + cfg.Kubeconfig
		if exp, ok := client.TokenExpiry(); ok && time.Now().After(exp) {
			failure += ", which expired at " + exp.UTC().Format(time.RFC3339) + " by this node's clock (the istio-cni node agent renews it: is it running?)"
		}
	}
	return nil, cniError(types.ErrTryAgainLater, fmt.Errorf("%s: lookup failed after %d tries in %s (bound %s): %s: %w",
		target.errPrefix, counted, time.Since(start).Round(time.Millisecond), bound, failure, lastErr))
}

// credentialsRefused reports whether err says the kubeconfig's credentials are
// stale: its token refused (HTTP 401), or the API server's certificate not
// trusted by its CA.
func credentialsRefused(err error) bool {
	var cert *tls.CertificateVerificationError
	return tokenRefused(err) || errors.As(err, &cert)
}

// tokenRefused reports whether err is the API server's HTTP 401: the kubeconfig's
// token is not (or no longer) accepted.
func tokenRefused(err error) bool {
	var status *kube.StatusError
	return errors.As(err, &status) && status.Code == 401
}

// behind reports whether err is an answer a lagging cache gives: the object not
// found, or another one of the same name (its predecessor).
func behind(err error) bool {
	return errors.Is(err, kube.ErrNotFound) || errors.Is(err, ErrOtherPod) || errors.Is(err, errOtherNamespace)
}

// PodRequestTimeout bounds one GET of the pod (or its namespace); the lookup's bound
// (PodLookup.Bound) bounds them all.
const PodRequestTimeout = 5 * time.Second

// lookupFailure says in words why a lookup's last try failed; kind is what was
// looked up ("pod", "namespace").
func lookupFailure(err error, kind string) string {
	var status *kube.StatusError
	var decode *kube.DecodeError
	var cert *tls.CertificateVerificationError
	var netErr net.Error
	switch {
	case errors.Is(err, kube.ErrNotFound):
		return "the " + kind + " does not exist"
	case errors.As(err, &status):
		return fmt.Sprintf("the API server refused with HTTP %d", status.Code)
	case errors.As(err, &decode), errors.Is(err, errOtherNamespace):
		return "the API server's answer is not a " + kind
	case errors.As(err, &cert):
		return "the API server's certificate is not trusted"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "the API server did not answer in time"
	case errors.Is(err, ErrOtherPod):
		return "the API server has another pod of that name"
	}
	return "the API server could not be reached"
}

// ApplyAndWarn applies plan in the network namespace at netns as capture.Apply
// does, and logs each native iptables-nft write the kernel refused before the
// restore wrote the same rules (the pod is captured either way; see
// iptables.WithNativeFallbacks): the plugin's ADD applies through it, and the
// repair in place through ApplyVerifiedAndWarn. The ADD verifies nothing after
// it (CHECK does, later, taking the namespace's apply lock again).
func ApplyAndWarn(ctx context.Context, log *slog.Logger, netns string, b capture.Backend, plan *redirect.Plan) error {
	_, err := applyAndWarn(ctx, log, netns, b, plan, false)
	return err
}

// ApplyVerifiedAndWarn is ApplyAndWarn, and lists the differences from plan of
// what the apply left, read under the same hold of the namespace's apply lock
// (capture.ApplyAndVerify): the agent's repair in place, which fails on any.
func ApplyVerifiedAndWarn(ctx context.Context, log *slog.Logger, netns string, b capture.Backend, plan *redirect.Plan) (diffs []string, err error) {
	return applyAndWarn(ctx, log, netns, b, plan, true)
}

func applyAndWarn(ctx context.Context, log *slog.Logger, netns string, b capture.Backend, plan *redirect.Plan, verify bool) (diffs []string, err error) {
	var refused []error
	ctx = iptables.WithNativeFallbacks(ctx, &refused)
	if verify {
		_, diffs, err = capture.ApplyAndVerify(ctx, netns, b, plan)
	} else {
		_, err = capture.Apply(ctx, netns, b, plan)
	}
	warnRefused(log, refused)
	return diffs, err
}

func warnRefused(log *slog.Logger, refused []error) {
	for _, r := range refused {
		log.Warn("iptables: the kernel refused the native netlink batch; iptables-restore did its work instead", "error", r)
	}
}

// NewBackend picks the rule backend the config names; the repair path uses it to
// program a pod exactly as the plugin would.
func NewBackend(cfg *Config) (capture.Backend, error) {
	if cfg.Backend == BackendNftables {
		return nftables.NewBackend(), nil
	}
	dir := filepath.Join(cfg.AgentRunDir, XtablesDirName)
	return iptables.NewBackend(iptables.Config{Mode: cfg.IptablesMode, LockDir: dir, NativeStateDir: dir})
}

// Del removes our rules when the namespace still exists. It always succeeds for a
// namespace that is gone, and never fails for lack of the pod (DEL must be idempotent).
// A config that no longer validates (edited, or refused by a stricter build, since
// the pod's ADD) still names where the rules are (CleanupConfig): they are removed
// as with a valid one. Its log line has its run time and phases, as an ADD's has.
func (p *Plugin) Del(args *cnicmd.CmdArgs) error {
	start := time.Now()
	rec := p.recorder()
	cfg, log, err := p.setup(args, "DEL", rec)
	defer log.Close()
	if err != nil {
		if cfg, err = CleanupConfig(args.StdinData); err != nil {
			// Nothing of ours can be found without the config; do not block the
			// pod's deletion.
			log.Debug("DEL: nothing to do: the config does not say where the rules are", "error", err)
			return nil
		}
		log.Logger = log.With("command", "DEL", "containerID", shortID(args.ContainerID), "netns", args.Netns)
	}
	if podArgs, err := ParsePodArgs(args.Args); err == nil && podArgs.Name != "" {
		log.Logger = log.With("pod", podArgs.Key())
	}
	if args.Netns == "" {
		log.Debug("DEL: no network namespace, nothing to do")
		return nil
	}
	if _, err := os.Stat(args.Netns); err != nil {
		log.Debug("DEL: network namespace already gone")
		return nil
	}
	b, err := NewBackend(cfg)
	if err != nil {
		log.Warn("DEL: no backend", "error", err)
		return nil
	}
	rec.Mark("backend")
	ctx, cancel := context.WithTimeout(timing.With(context.Background(), rec), p.Timeout)
	defer cancel()
	var refused []error
	routing, err := capture.Cleanup(iptables.WithNativeFallbacks(ctx, &refused), args.Netns, b, nil)
	warnRefused(log.Logger, refused)
	attrs := []any{"took", time.Since(start), "phases", rec}
	if len(routing) > 0 {
		attrs = append(attrs, "routingRemoved", routing)
	}
	if err != nil {
		if _, gone := netnsGone(args.Netns, err); gone {
			// Its file left, its mount gone: nothing of ours is left either.
			log.Debug("DEL: network namespace already gone", append([]any{"error", err}, attrs...)...)
			return nil
		}
		// The namespace is about to be destroyed with everything in it.
		log.Warn("DEL: cleanup incomplete", append([]any{"error", err}, attrs...)...)
		return nil
	}
	log.Info("DEL: done", attrs...)
	return nil
}

// Check verifies that the capture the ADD installed is in place (Istio's CHECK
// verifies nothing). CRI-O runs CHECK right after each ADD and, for config lists
// of CNI 0.4.0 and later, for every sandbox each time it starts, and a sandbox
// whose CHECK fails there loses its address: the kubelet recreates the pod. So
// CHECK fails only on what shows the capture missing or cut (capture.Check); a pod
// it cannot read now, or whose settings (or this plugin) changed since the ADD,
// which Kubernetes does not run again, is logged, not failed.
func (p *Plugin) Check(args *cnicmd.CmdArgs) error {
	return p.withConfig(args, "CHECK", func(cfg *Config, log *pluginlog.Logger) error {
		// Every failure leaves one "CHECK failed" record, as every failed ADD leaves
		// an "ADD failed" one: no record at all reads as "the plugin did not run".
		err := p.check(args, cfg, log)
		if err != nil {
			log.Error("CHECK failed", "error", err)
		}
		return err
	})
}

func (p *Plugin) check(args *cnicmd.CmdArgs, cfg *Config, log *pluginlog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	if !cfg.HasPrevResult() {
		// The spec has the runtime pass the result of the pod's ADD, and the
		// plugin consult it (libcni passes the one it cached): without it there is
		// no ADD to compare with, as the reference chained plugins refuse.
		return cniError(types.ErrInvalidNetworkConfig, errors.New(`plugin config: "prevResult": missing: CHECK needs the result of the pod's ADD, which the runtime must pass (CNI spec, CHECK)`))
	}
	ips, err := cfg.PrevResultIPs()
	if err != nil {
		return cniError(types.ErrDecodingFailure, err)
	}
	podArgs, d, err := decideWithoutPod(ctx, args, cfg, log)
	if err != nil {
		_, err = failedStep(err)
		return err
	}
	if d.Verdict == Skip {
		log.Debug("CHECK: pod is not redirected", "reason", d.Reason)
		return nil
	}
	pp, err := p.decide(ctx, cfg, podArgs, args.Netns, log, PodLookup{Retries: 3, Interval: 500 * time.Millisecond}, ips)
	d, plan := pp.Decision, pp.Plan
	switch {
	case err != nil:
		// Not a sign of a broken capture: what is in the namespace is judged alone.
		_, err = failedStep(err)
		log.Warn("CHECK: the pod's settings give no capture to compare with now; its rules are judged by themselves", "error", err)
	case d.Verdict != Redirect:
		log.Debug("CHECK: pod is not redirected", "reason", d.Reason)
		return nil
	}
	b, err := NewBackend(cfg)
	if err != nil {
		return cniError(types.ErrInternal, err)
	}
	broken, differ, err := capture.Check(ctx, args.Netns, b, plan)
	if err != nil {
		if gone, ok := netnsGone(args.Netns, err); ok {
			return gone
		}
		return cniError(types.ErrInternal, err)
	}
	if len(broken) > 0 {
		diffs := append(broken, differ...)
		err := fmt.Errorf("traffic redirection is not as the pod requires (%d differences): %s", len(diffs), strings.Join(diffs, "; "))
		return cniError(types.ErrInternal, err)
	}
	if len(differ) > 0 {
		log.Warn("CHECK: the capture is in place, with rules other than the pod's settings ask for now: "+
			"changed since its ADD (an annotation edited, the plugin upgraded), they take effect when the pod is recreated",
			"differences", differ)
		return nil
	}
	log.Debug("CHECK: rules match")
	return nil
}

// loadKubeconfig reads the plugin's kubeconfig as the lookup uses it: with its
// server replaced by the legacy kubernetes.k8s_api_root when that is set. STATUS
// and the lookup both read it here, so that STATUS fails only where the lookup
// would.
func (cfg *Config) loadKubeconfig() (*kube.Kubeconfig, error) {
	kc, err := kube.LoadKubeconfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if err := cfg.OverrideServer(kc); err != nil {
		return nil, err
	}
	return kc, nil
}

// OverrideServer puts the legacy kubernetes.k8s_api_root, when set, in place of
// kc's server. An http root for a kubeconfig whose server is https is refused: the
// kubeconfig's token would go out in clear text, and pod specs (which decide the
// capture) would come back unverified.
func (cfg *Config) OverrideServer(kc *kube.Kubeconfig) error {
	if cfg.K8sAPIRoot == "" {
		return nil
	}
	if strings.HasPrefix(strings.ToLower(kc.Server), "https://") && !strings.HasPrefix(strings.ToLower(cfg.K8sAPIRoot), "https://") {
		// The plugin's config is at fault, whatever the lookup's retries: not a
		// "try again later".
		return withCode(types.ErrInvalidNetworkConfig, fmt.Errorf("kubernetes.k8s_api_root %s: the kubeconfig's server %s is https, and the override would send its credentials without TLS; use an https URL or leave k8s_api_root out",
			kube.RedactURL(cfg.K8sAPIRoot), kube.RedactURL(kc.Server)))
	}
	kc.Server = cfg.K8sAPIRoot
	return nil
}

// rememberIptablesVersion does in STATUS, which the runtime runs every few
// seconds, what the first ADD on the node would do otherwise: in iptables mode,
// ask the node's iptables-nft-restore its version, once per node and binary, and
// remember it in the run dir (iptables.Backend.NativeWrites). Without it, every
// ADD of a burst after an install or a reboot ran the binary at once
// (BenchmarkPluginAddParallel's iptables-version-unknown: 20 ADDs at once, p50
// 63-73 ms against 40-45 with the answer remembered). Best effort: whatever it
// could not do, the next ADD does.
func rememberIptablesVersion(cfg *Config, log *pluginlog.Logger) {
	if cfg.Backend == BackendNftables {
		return
	}
	b, err := NewBackend(cfg)
	if err != nil {
		log.Debug("STATUS: no iptables backend to ask its version", "error", err)
		return
	}
	if ib, ok := b.(*iptables.Backend); ok {
		log.Debug("STATUS: iptables-nft native writes", "allowed", ib.NativeWrites())
	}
}

// GC removes per-namespace xtables lock files that have not been used for an hour,
// and the temporary files of the node's iptables-nft version that a killed plugin
// left (no live writer holds their lock: livetemp): besides the locks the plugin
// keeps only that version there (one small file, see
// iptables.Config.NativeStateDir) outside pod namespaces. A config that no longer
// validates still names the run directory (CleanupConfig): GC goes on there, as
// the spec asks, and reports the config's error after.
func (p *Plugin) GC(args *cnicmd.CmdArgs) error {
	cfg, log, err := p.setup(args, "GC", nil)
	defer log.Close()
	if err != nil {
		if c, cerr := CleanupConfig(args.StdinData); cerr == nil {
			gc(c, log)
		}
		return err
	}
	gc(cfg, log)
	return nil
}

func gc(cfg *Config, log *pluginlog.Logger) {
	dir := filepath.Join(cfg.AgentRunDir, XtablesDirName)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	removed := 0
	for _, e := range entries {
		info, err := e.Info()
		if err == nil && strings.HasPrefix(e.Name(), "xtables-") && time.Since(info.ModTime()) > time.Hour &&
			removeUnheldLock(filepath.Join(dir, e.Name())) {
			removed++
		}
	}
	temps := iptables.RemoveAbandonedVersionTemps(dir)
	log.Debug("GC done", "removedLockFiles", removed, "removedTemporaries", temps)
}

// removeUnheldLock removes the lock file at path unless a process holds its lock
// now: opening or locking it changes none of its times, so its age alone does not
// say it is unused. It is unlinked while GC holds the lock itself, so no writer
// holds it then; one that opened it just before may still lock the unlinked file:
// the apply lock files of builds before this one (xtables-apply-*: the apply
// lock is now an flock of the namespace itself, applylock) were opened again
// then, while iptables' own xtables lock is as exposed as any removable lock
// file.
func removeUnheldLock(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return false // held: in use
	}
	return os.Remove(path) == nil
}

// processUsage is the process's own CPU time so far and its context switches
// (getrusage of this process, every thread): on an ADD's outcome line, beside
// "took", it tells an ADD that waited for a CPU on a busy node (CPU far below its
// time, involuntary switches: it was preempted) from one that did the work or
// waited on a system call (voluntary switches). Empty when getrusage fails.
func processUsage() slog.Attr {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return slog.Attr{}
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return slog.Group("process", "cpu", cpu, "voluntarySwitches", ru.Nvcsw, "involuntarySwitches", ru.Nivcsw)
}

// logPeakMemory logs, at debug level, the process's peak resident memory (VmHWM of
// its own address space; getrusage would also count the runtime's memory at fork).
func logPeakMemory(log *pluginlog.Logger) {
	if !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			log.Debug("peak memory", "peakRSS", strings.TrimSpace(v))
		}
	}
}

// NodeRootIn is the node's root filesystem as a container sees it through the
// node's /proc mounted at hostProc, or "" when it cannot be seen. It is the root of
// the node's PID 1, or where that is not readable (reading another process's root
// needs CAP_SYS_PTRACE, and some hosts refuse it for PID 1) the root of the
// kubelet or the container runtime, which run on the node's own filesystem.
func NodeRootIn(hostProc string) string {
	readable := func(pid string) string {
		root := filepath.Join(hostProc, pid, "root")
		if _, err := os.Stat(filepath.Join(root, "usr")); err != nil {
			return ""
		}
		return root
	}
	if root := readable("1"); root != "" {
		return root
	}
	entries, err := os.ReadDir(hostProc)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(hostProc, e.Name(), "comm"))
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(comm)) {
		case "kubelet", "containerd", "crio":
			if root := readable(e.Name()); root != "" {
				return root
			}
		}
	}
	return ""
}

// NodeViewIn is the node's filesystem as a container sees it (the agent's, the
// doctor's in the agent pod): all of it through the node's /proc mounted at
// hostProc (NodeRootIn), else those of the node's iptables.NodePathDirs mounted
// at their own paths under dirsRoot (the chart's read-only /host/usr, /host/sbin
// and /host/bin), else nothing (a view that is not Visible).
func NodeViewIn(hostProc, dirsRoot string) iptables.NodeView {
	if root := NodeRootIn(hostProc); root != "" {
		return iptables.NodeView{Root: root}
	}
	if dirsRoot == "" {
		return iptables.NodeView{}
	}
	var dirs []string
	for _, d := range iptables.NodePathDirs {
		if fi, err := os.Stat(filepath.Join(dirsRoot, d)); err == nil && fi.IsDir() {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		return iptables.NodeView{}
	}
	return iptables.NodeView{Root: dirsRoot, Dirs: dirs}
}

// ForNode returns cfg for code that programs or reads pods' rules from a container
// on the node (repair in place, the doctor in the agent pod) rather than from the
// node as the plugin does. When cfg leaves the iptables flavour to detection, the
// flavour is the one the node's plugin detects from the node's own binaries (seen
// in view), not the container's: the agent image carries both flavours, and
// reading or writing the other one would miss the plugin's rules or add a second
// set. With a view that is not Visible cfg is returned unchanged.
func ForNode(cfg *Config, view iptables.NodeView) *Config {
	if cfg.Backend == BackendNftables || cfg.IptablesMode != iptables.ModeAuto || !view.Visible() {
		return cfg
	}
	c := *cfg
	c.IptablesMode = iptables.DetectMode(view)
	return &c
}
