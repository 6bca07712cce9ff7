package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/daemonset"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/taint"
	"github.com/istio-cni/istio-cni/internal/unixsock"
	"github.com/istio-cni/istio-cni/internal/version"
)

// agent is one run of the node agent. Everything below is touched only by the
// event loop's goroutine, except metrics and ready.
type agent struct {
	s     *Settings
	log   *slog.Logger
	m     *metrics
	entry []byte
	bins  []binary
	// binDirs are the directories the binaries go to.
	binDirs []string

	cfg configState
	// binsInstalled and kubeconfigWritten tell a first install from a restore.
	binsInstalled     bool
	kubeconfigWritten bool
	binsOK, kubeOK    bool
	// pluginCfg is the entry as the plugin reads it; nodeOK says the node check
	// (reconcileNode) found nothing missing for its backend, nodeSeen what it
	// last logged of a check that found nothing missing.
	pluginCfg *plugin.Config
	nodeOK    bool
	nodeSeen  string
	// kubeconfigLast is the kubeconfig this agent last wrote or found in place: a
	// file holding neither it nor the one wanted now was written by someone else.
	kubeconfigLast []byte
	// contests holds, per file, the overwrites of another writer's content
	// (mayOverwrite).
	contests map[string]*contest
	// contestWake is when a pending wake asks endContests to look again.
	contestWake time.Time
	// reported holds the last error logged per key, so a file that stays broken is
	// reported once, not on every event.
	reported map[string]string
	// unsettled holds config errors seen once and not yet logged: a daemon that
	// writes its file in place shows a half-written file for a moment. recheck wakes
	// the loop once settleDelay later; an error still there then is logged.
	unsettled map[string]unsettledError
	recheck   chan struct{}
	// retry wakes the loop to try again what failed for a reason no event will
	// announce (a full disk, a read-only remount): retryDirty, after retryDelay,
	// which doubles from retryMin to retryMax while the failures go on.
	retry        chan struct{}
	retryDirty   dirty
	retryDelay   time.Duration
	retryPending bool

	ready atomic.Bool
	// whyNotReady is what /readyz answers when the agent is not ready.
	whyNotReady atomic.Pointer[string]

	// tokens keeps the plugin's token fresh (nil without PLUGIN_SERVICE_ACCOUNT).
	tokens *tokenSource
	// owner is this agent's DaemonSet, learnt at start for the exit decision.
	owner atomic.Pointer[owner]

	// logs are the plugin log sockets this agent serves, podCacheGone tells the pod
	// cache its socket may be gone (nil without one): retakeSockets.
	logs         *pluginLogServers
	podCacheGone func()
}

// newAgent is an agent with its bookkeeping ready and nothing installed yet.
func newAgent(s *Settings, log *slog.Logger) *agent {
	return &agent{s: s, log: log, m: newMetrics(), reported: map[string]string{}, nodeOK: true,
		unsettled: map[string]unsettledError{}, contests: map[string]*contest{}, recheck: make(chan struct{}, 1), retry: make(chan struct{}, 1)}
}

// Run installs the plugin, keeps it installed until ctx ends, then uninstalls it.
// Plugin log records go to stdout; the agent's own log to log. Errors before the
// watch starts (settings the node contradicts, ports in use) end Run, before it
// has touched the plugin log sockets of an agent that may still be running;
// errors while watching are logged and retried on the next change.
func Run(ctx context.Context, s Settings, stdout io.Writer, log *slog.Logger) (err error) {
	// Parse refuses an empty node name when a feature watching this node's pods is on.
	if s.NodeName == "" {
		s.NodeName, _ = os.Hostname() // only fills __KUBERNETES_NODE_NAME__
	}
	a := newAgent(&s, log)
	template := s.NetworkConfig
	if s.NetworkConfigFile != "" {
		b, err := cniconf.ReadConfig(s.NetworkConfigFile)
		if err != nil {
			return fmt.Errorf("CNI_NETWORK_CONFIG_FILE: %w", err)
		}
		template = string(b)
	}
	if a.entry, err = Entry(&s, template); err != nil {
		return err
	}
	if a.pluginCfg, err = repairPluginConfig(a.entry); err != nil {
		return err
	}
	if a.bins, err = sourceBinaries(&s); err != nil {
		return err
	}
	a.binDirs = []string{s.MountedBinDir}
	if s.SecondaryBinDir != "" {
		if fi, err := os.Stat(s.SecondaryBinDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("SECONDARY_BIN_DIR %q is not a directory: %v", s.SecondaryBinDir, errOr(err, "a file"))
		}
		a.binDirs = append(a.binDirs, s.SecondaryBinDir)
	}
	if s.Repair.Enabled && s.Repair.RepairPods {
		// Repair in place enters pods' namespaces through the node's processes: a
		// missing /proc mount would leave every pod unrepaired while the agent ran.
		if fi, err := os.Stat(s.Repair.ProcDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("%s %q is not a directory, so repair in place (%s=true) could enter no pod's network namespace: "+
				"mount the node's /proc there (the chart does with repair.repairPods), or set %s=/proc with hostPID: %v",
				repair.EnvProcDir, s.Repair.ProcDir, repair.EnvRepairPods, repair.EnvProcDir, errOr(err, "not a directory"))
		}
	}
	for _, d := range []string{s.MountedNetDir, s.MountedBinDir, s.RunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}

	// Whatever may fail comes before the run dir's sockets, which a previous agent
	// may still be serving: a new agent started while the old one holds the ports (a
	// rolling update on the host network) must exit leaving them to it.
	stopHTTP, err := a.serveHTTP()
	if err != nil {
		return err
	}
	defer stopHTTP()

	var client *apiClient
	if s.NeedsAPIServer() {
		// client-go logs through klog; keep one log stream, in the agent's format.
		klog.SetSlogLogger(log.With("component", "client-go"))
		if client, err = newAPIClient(RestConfig(&s)); err != nil {
			return fmt.Errorf("API client for %s:%d: %w", s.KubeHost, s.KubePort, err)
		}
	}
	if s.PluginServiceAccount != "" {
		a.tokens = newTokenSource(client.core, &s, log.With("component", "plugin-token"))
		a.tokens.m = a.m
	} else if s.UninstallOnExit != ExitAlways {
		log.Warn("the plugin's kubeconfig carries this agent's own token, which the API server stops accepting once this pod is deleted: "+
			"between this agent's exit and the next agent's start the plugin cannot look pods up (pods wait, they are not left uncaptured); "+
			"set PLUGIN_SERVICE_ACCOUNT (the chart does) for a token that outlives the agent", "uninstallOnExit", s.UninstallOnExit)
	}
	w, err := a.watch()
	if err != nil {
		return err
	}
	defer w.Close()
	// Before the features start, which make files and sockets here from their first
	// moment (the cleanup leaves what a live writer holds in any case: livetemp).
	for _, d := range a.binDirs {
		removeStaleTemps(d)
	}
	removeStaleConfTemps(s.MountedNetDir)
	removeStaleRunDirFiles(&s, log)
	startControllers, err := a.startControllers(ctx, client)
	if err != nil {
		return err
	}

	// Taken over now: a socket there is a previous agent's.
	a.logs = &pluginLogServers{s: &s, sink: &pluginLogSink{out: stdout, m: a.m}, log: log}
	if err := a.logs.serve(); err != nil {
		return err
	}
	defer a.logs.stop()
	// After the log sockets: the pod cache takes over a running agent's pods.sock
	// and pod files from its first moment, which a start that fails must leave.
	stopControllers := startControllers()
	defer stopControllers()

	for _, n := range s.Notices {
		log.Warn(n)
	}
	log.Info("install-cni started", "version", version.Version, "chained", s.Chained, "confDir", s.MountedNetDir, "binDirs", a.binDirs,
		"runDir", s.RunDir, "entryType", s.PluginName())

	a.reconcile(dirtyAll)
	a.loop(ctx, w)
	w.Close()
	// The exit decision's requests are made while the features stop, each within its
	// bound (ExitLookupBound, controllerStopWait): ExitBound in all. The features
	// stop before the uninstall: repair must not judge pods that start while the
	// entry is taken out, nor the taint controller act on the node meanwhile.
	decided := make(chan exitDecision, 1)
	go func() { decided <- a.decideExit(client) }()
	stopControllers()

	// Uninstall: the watch is closed first so that our own removals are not undone.
	a.setReady("the agent is stopping")
	d := <-decided
	if !d.Uninstall {
		log.Info("exiting with the plugin installed: pods keep being captured until the next agent takes over", "reason", d.Reason,
			"uninstallOnExit", s.UninstallOnExit)
		return nil
	}
	log.Info("uninstalling", "reason", d.Reason, "uninstallOnExit", s.UninstallOnExit)
	if d.NoAgentFollows && s.Taint.Enabled {
		a.untaintNode(client)
	}
	return a.uninstall()
}

// untaintNode removes the readiness taint from this node when no agent will run
// here again: no agent would become ready to lift it, and the taint controller
// leaves a node whose agent is terminating as it is. Within ExitUntaintBound; a
// failure is logged with the command that removes it by hand (helm uninstall may
// have deleted this agent's grants already).
func (a *agent) untaintNode(client *apiClient) {
	s := a.s
	ctx, cancel := context.WithTimeout(context.Background(), ExitUntaintBound)
	defer cancel()
	removed, err := taint.RemoveTaint(ctx, client.core.Nodes(), s.NodeName, s.Taint.Key)
	switch {
	case err != nil:
		a.log.Warn("node readiness taint not removed: no agent will run on this node to remove it; remove it by hand",
			"node", s.NodeName, "taint", s.Taint.Key, "command", "kubectl taint nodes "+s.NodeName+" "+s.Taint.Key+"-", "error", err)
	case removed:
		a.log.Info("node readiness taint removed: no agent will run on this node again", "node", s.NodeName, "taint", s.Taint.Key)
	}
}

// decideExit applies UNINSTALL_ON_EXIT; auto asks the API server, within
// ExitLookupBound.
func (a *agent) decideExit(client *apiClient) exitDecision {
	switch a.s.UninstallOnExit {
	case ExitAlways:
		return exitDecision{Uninstall: true, Reason: "UNINSTALL_ON_EXIT=always"}
	case ExitNever:
		return exitDecision{Reason: "UNINSTALL_ON_EXIT=never"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), ExitLookupBound)
	defer cancel()
	var o owner
	if p := a.owner.Load(); p != nil {
		o = *p
	}
	return decideExit(ctx, client, a.pluginIdentity(), o, a.s.PodNamespace, a.s.PodName, a.s.NodeName, a.s.Taint.Key, a.s.Taint.AgentSelector)
}

// learnOwner reads this agent's pod until it has its DaemonSet (retrying every
// few seconds while the API server does not answer), for the exit decision, and
// then checks the exit decision's other reads (checkExitGrants).
func (a *agent) learnOwner(ctx context.Context, client *apiClient) error {
	var reported string
	for {
		rctx, cancel := context.WithTimeout(ctx, ExitLookupBound)
		pod, err := client.getPod(rctx, a.s.PodNamespace, a.s.PodName)
		cancel()
		if err != nil && ctx.Err() == nil && err.Error() != reported {
			// Once per distinct error: the exit decision then reads the pod on exit.
			reported = err.Error()
			a.log.Warn("cannot read this agent's pod to learn its DaemonSet; retrying every 5s", "pod", a.s.PodNamespace+"/"+a.s.PodName,
				"error", shortAPIError(err))
		}
		if err == nil {
			o := owner{known: true, daemonSet: daemonset.ControllerOf(pod)}
			a.owner.Store(&o)
			if o.daemonSet == nil {
				a.log.Warn("this agent's pod is not run by a DaemonSet: nothing will start another agent on this node, so the plugin is uninstalled when it exits",
					"pod", a.s.PodNamespace+"/"+a.s.PodName)
			} else {
				a.log.Info("the exit decision watches this agent's DaemonSet", "daemonSet", a.s.PodNamespace+"/"+o.daemonSet.Name)
			}
			a.checkExitGrants(ctx, client, o)
			return nil
		}
		t := time.NewTimer(5 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// dirty marks what an event may have changed.
type dirty uint8

const (
	dirtyConfig dirty = 1 << iota
	dirtyBinaries
	dirtyKubeconfig
	dirtySockets
	// dirtyNode: the node check (reconcileNode). No event announces a change of
	// the node's tools or kernel: it runs at start, and again as a failed step is
	// retried while it finds something missing.
	dirtyNode
	dirtyAll = dirtyConfig | dirtyBinaries | dirtyKubeconfig | dirtySockets | dirtyNode
)

// watchedDir is a directory and how its events are read.
type watchedDir struct {
	dir   string
	names func(name string) dirty
}

func (a *agent) watchedDirs() []watchedDir {
	var out []watchedDir
	out = append(out, watchedDir{a.s.MountedNetDir, func(name string) dirty {
		if slices.Contains(cniconf.Extensions, filepath.Ext(name)) {
			return dirtyConfig
		}
		return 0
	}})
	binNames := map[string]bool{}
	for _, b := range a.bins {
		binNames[a.s.BinariesPrefix+b.name] = true
	}
	for _, d := range a.binDirs {
		out = append(out, watchedDir{d, func(name string) dirty {
			if binNames[name] {
				return dirtyBinaries
			}
			return 0
		}})
	}
	kubeconfigName := filepath.Base(a.s.KubeconfigPath())
	sockets := map[string]bool{}
	for _, p := range a.s.socketPaths() {
		sockets[filepath.Base(p)] = true
	}
	out = append(out, watchedDir{a.s.RunDir, func(name string) dirty {
		switch {
		case name == kubeconfigName:
			return dirtyKubeconfig
		case sockets[name]:
			return dirtySockets
		}
		return 0
	}})
	// Projected tokens rotate by swapping a ..data symlink: any change in the
	// directory may be a new token or CA.
	out = append(out, watchedDir{a.s.ServiceAccountDir, func(string) dirty { return dirtyKubeconfig }})
	if caDir := filepath.Dir(a.s.CAFile()); caDir != a.s.ServiceAccountDir && !a.s.SkipTLSVerify {
		out = append(out, watchedDir{caDir, func(string) dirty { return dirtyKubeconfig }})
	}
	return out
}

// watcher routes fsnotify events to what they may have changed.
type watcher struct {
	*fsnotify.Watcher
	dirs map[string][]watchedDir
	// linked is the file the config holding our entry links to, when it is a
	// symbolic link (watchLinkedConfig), and linkedDirs the directories watched for it.
	linked     string
	linkedDirs map[string]bool
}

func (a *agent) watch() (*watcher, error) {
	fw, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		return nil, fmt.Errorf("watch: %w%s", err, inotifyHint(err))
	}
	w := &watcher{Watcher: fw, dirs: map[string][]watchedDir{}}
	for _, d := range a.watchedDirs() {
		if _, ok := w.dirs[d.dir]; !ok {
			if err := fw.Add(d.dir); err != nil {
				fw.Close()
				return nil, fmt.Errorf("watch %s: %w%s", d.dir, err, inotifyHint(err))
			}
		}
		w.dirs[d.dir] = append(w.dirs[d.dir], d)
	}
	return w, nil
}

// inotifyHint names the limit behind an inotify error, which the kernel reports as
// "too many open files" or "no space left on device": nodes that run many pods
// watching files (log shippers, config reloaders) reach the per-user limits, which
// are the node's sysctls, not this pod's.
func inotifyHint(err error) string {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return " (the node's inotify instances, sysctl fs.inotify.max_user_instances, or this process's open file limit are used up)"
	case errors.Is(err, syscall.ENOSPC):
		return " (the node's inotify watches are used up: raise sysctl fs.inotify.max_user_watches)"
	}
	return ""
}

func (w *watcher) classify(ev fsnotify.Event) dirty {
	var d dirty
	for _, wd := range w.dirs[filepath.Dir(ev.Name)] {
		d |= wd.names(filepath.Base(ev.Name))
	}
	if w.linked != "" && filepath.Clean(ev.Name) == w.linked {
		d |= dirtyConfig
	}
	return d
}

// watchLinkedConfig watches the file that the config holding our entry links to,
// when it is a symbolic link: a primary CNI that keeps its config elsewhere (another
// directory, a subdirectory, a name the runtime does not load) rewrites that file,
// and the conf dir's watch sees no event of it. Best effort: a directory that cannot
// be watched is logged, and the entry is then put back at the conf dir's next event.
//
// added says a directory's watch was added for the file: a rewrite of it between
// the reconcile that found the link and the watch's start made no event, so the
// caller looks at the config again (the loop does, before it waits).
func (a *agent) watchLinkedConfig(w *watcher) (added bool) {
	w.linked = ""
	if a.cfg.current == "" {
		return false
	}
	target, err := filepath.EvalSymlinks(a.cfg.current)
	if err != nil || target == filepath.Clean(a.cfg.current) {
		return false
	}
	dir, name := filepath.Dir(target), filepath.Base(target)
	// Events name a directory as it was added: a directory watched already (the
	// conf dir, under a path that may not be the resolved one) keeps its path.
	fi, err := os.Stat(dir)
	if err != nil {
		return false
	}
	for _, known := range slices.Concat(slices.Collect(maps.Keys(w.dirs)), slices.Collect(maps.Keys(w.linkedDirs))) {
		if ki, err := os.Stat(known); err == nil && os.SameFile(fi, ki) {
			w.linked = filepath.Join(known, name)
			return false
		}
	}
	if err := w.Add(dir); err != nil {
		a.report("watch:"+dir, fmt.Errorf("watch %s, the directory of %s, which %s links to: %w%s", dir, name, a.cfg.current, err, inotifyHint(err)),
			"a rewrite of that file is noticed only at the config dir's next change")
		return false
	}
	if w.linkedDirs == nil {
		w.linkedDirs = map[string]bool{}
	}
	w.linkedDirs[dir] = true
	w.linked = target
	return true
}

// loop reacts to changes until ctx ends. Events that arrive together are handled in
// one reconcile; nothing runs while nothing changes (no polling).
func (a *agent) loop(ctx context.Context, w *watcher) {
	for {
		if a.watchLinkedConfig(w) {
			// Its rewrites since the reconcile that found the link made no event.
			a.reconcile(dirtyConfig)
			continue
		}
		var d dirty
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			d |= w.classify(ev)
		case <-a.recheck:
			d = dirtyConfig
		case <-a.retry:
			a.retryPending = false
			d = a.retryDirty
		case <-a.tokenChanged():
			d = dirtyKubeconfig
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: look at everything again.
			a.log.Error("watch", "error", err)
			d = dirtyAll
		}
	drain:
		for {
			select {
			case ev := <-w.Events:
				d |= w.classify(ev)
			default:
				break drain
			}
		}
		if d != 0 {
			a.reconcile(d)
		}
	}
}

// tokenChanged is the token source's signal, or nil (never ready) without one.
func (a *agent) tokenChanged() <-chan struct{} {
	if a.tokens == nil {
		return nil
	}
	return a.tokens.changed
}

// reconcile puts back whatever d says may be missing, and updates readiness. What
// failed for a reason other than a broken config (which waits for the config dir's
// next change) is tried again later (scheduleRetry).
func (a *agent) reconcile(d dirty) {
	var failed dirty
	if d&dirtyBinaries != 0 {
		if a.reconcileBinaries() {
			failed |= dirtyBinaries
		}
	}
	if d&dirtyKubeconfig != 0 {
		if a.reconcileKubeconfig() {
			failed |= dirtyKubeconfig
		}
	}
	if d&dirtySockets != 0 {
		if a.retakeSockets() {
			failed |= dirtySockets
		}
	}
	if d&dirtyNode != 0 {
		if a.reconcileNode() {
			failed |= dirtyNode
		}
	}
	if d&dirtyConfig != 0 {
		wasInPlace := a.cfg.inPlace
		res, err := a.reconcileConfig()
		var invalid *cniconf.InvalidError
		switch {
		case err != nil && errors.As(err, &invalid):
			if a.settled("config", err) {
				a.report("config", err, "waiting for the next change to the config dir")
				a.m.installFailed(installConfigFailure)
			}
		case err != nil:
			failed |= dirtyConfig
			a.report("config", err, retryHint)
			a.m.installFailed(installConfigFailure)
		case res == configContested:
			failed |= dirtyConfig
		case (res == configInstalled || res == configUnchanged) && !wasInPlace:
			// Also when found in place (an earlier agent left it): the line the
			// README's check looks for. A write while in place (a re-insert, a
			// replaced or moved entry) has its own line (noteInstall, moveFrom).
			a.clearReport("config")
			a.log.Info("the CNI config holds the istio-cni entry", "file", a.cfg.current)
		default:
			a.clearReport("config")
		}
	}
	a.scheduleRetry(d, failed)
	a.endContests(time.Now())
	why := a.notReadyReason()
	ready := why == ""
	if ready != a.ready.Load() {
		if ready {
			a.log.Info("readiness changed", "ready", ready)
		} else {
			a.log.Info("readiness changed", "ready", ready, "reason", why)
		}
	}
	a.setReady(why)
}

// setReady makes the agent ready when why is empty, and not ready for why
// otherwise: what /readyz answers.
func (a *agent) setReady(why string) {
	a.whyNotReady.Store(&why)
	a.ready.Store(why == "")
	a.m.setReady(why == "")
}

// notReadyReason says what keeps the agent from being ready, with the errors of
// the steps that failed; empty when it is ready.
func (a *agent) notReadyReason() string {
	var why []string
	step := func(what string, keys ...string) {
		var errs []string
		for _, key := range slices.Sorted(maps.Keys(a.reported)) {
			if slices.ContainsFunc(keys, func(k string) bool { return key == k || strings.HasSuffix(k, ":") && strings.HasPrefix(key, k) }) {
				errs = append(errs, a.reported[key])
			}
		}
		if len(errs) > 0 {
			what += ": " + strings.Join(errs, "; ")
		}
		why = append(why, what)
	}
	if !a.cfg.inPlace {
		step("the CNI config in "+a.s.MountedNetDir+" does not hold the istio-cni entry yet", "primary", "config")
	} else if fighting, n := a.fightingPrimary(time.Now()); fighting {
		why = append(why, fmt.Sprintf("the primary CNI keeps rewriting %s without the istio-cni entry as soon as it is put back (%d times in %s, more than REVERT_WARN_COUNT %d): "+
			"pods started here meanwhile are not redirected; configure the primary CNI to keep chained plugins (Cilium: cni.exclusive=false)",
			a.cfg.current, n, a.s.RevertWarnWindow, a.s.RevertWarnCount))
	}
	if !a.binsOK {
		step("a plugin binary is not installed in "+strings.Join(a.binDirs, ", "), "bin:")
	}
	if !a.nodeOK {
		step("this node cannot run the plugin's rule backend, so every meshed pod's ADD fails here", keyNode)
	}
	if refused, ok := a.reported[keyTokenRefused]; ok && !a.kubeOK {
		why = append(why, "the plugin's kubeconfig "+a.s.KubeconfigPath()+" is written, but "+refused)
	} else if !a.kubeOK {
		step(a.kubeconfigNotWritten(), "kubeconfig", "plugin token")
	}
	return strings.Join(why, "; ")
}

// retakeSockets makes again this agent's sockets whose path is gone, and reports
// whether to try again later. Two agents on one node (a second DaemonSet, or
// Istio's beside this one) share the run dir: the one that starts later takes the
// sockets over, and when it stops it removes them as its own while this one runs
// on, listening where no plugin can reach it (its records lost to the plugin's
// file, every ADD asking the API server). A path another agent took over is its.
func (a *agent) retakeSockets() (retry bool) {
	if a.logs != nil {
		if err := a.logs.retake(); err != nil {
			a.report("sockets", err, retryHint)
			retry = true
		} else {
			a.clearReport("sockets")
		}
	}
	if a.podCacheGone != nil {
		a.podCacheGone() // the pod cache looks, and is run again if it is gone
	}
	return retry
}

// The bounds of the retry of a failed install step.
const (
	retryMin  = time.Second
	retryMax  = 30 * time.Second
	retryHint = "retrying after 1s, doubling to at most 30s, until it succeeds"
)

// scheduleRetry notes that the steps in failed failed (of those in tried) and, while
// any is still failing, wakes the loop to try them again: after retryMin, doubling
// up to retryMax; a success of every step resets the delay. One wake is pending at
// a time. Only the loop's goroutine calls it.
func (a *agent) scheduleRetry(tried, failed dirty) {
	a.retryDirty = a.retryDirty&^tried | failed
	if a.retryDirty == 0 {
		a.retryDelay = 0
		return
	}
	if a.retryPending {
		return
	}
	a.retryDelay = min(max(2*a.retryDelay, retryMin), retryMax)
	a.retryPending = true
	time.AfterFunc(a.retryDelay, func() {
		select {
		case a.retry <- struct{}{}:
		default:
		}
	})
}

// reconcileBinaries installs the binaries where they are missing or differ, and
// reports whether to try again later.
func (a *agent) reconcileBinaries() (retry bool) {
	ok, contested := true, false
	var overwrote string // the last target that held another installer's binary
	mayReplace := func(target string) bool {
		if !a.s.UpdateBinaries {
			return false
		}
		if !isExecutable(target) {
			return true
		}
		// Another installer's binary (Istio's install-cni during a migration, another
		// release's image) copies its own back when it sees ours: put back at once the
		// first few times, then spaced out. Its binary runs the entry meanwhile.
		if a.mayOverwrite(target, time.Now()) {
			overwrote = target
			return true
		}
		contested = true
		return false
	}
	for _, dir := range a.binDirs {
		for _, b := range a.bins {
			changed, err := b.install(dir, a.s.BinariesPrefix, mayReplace)
			key := "bin:" + filepath.Join(dir, b.name)
			if err != nil {
				ok = false
				a.m.installFailed(installBinariesFailure)
				a.report(key, err, hintForWriteError(err))
				continue
			}
			a.clearReport(key)
			if changed {
				a.m.binaryInstalls.Inc()
				verb := "installed"
				if a.binsInstalled {
					verb = "restored"
				}
				// A put-back over the other installer's binary in a reported contest goes
				// unlogged; the restore of a deleted one does not.
				if path := filepath.Join(dir, a.s.BinariesPrefix+b.name); path != overwrote || !a.contested(path) {
					a.log.Info(verb+" binary", "path", path)
				}
			}
		}
	}
	a.binsInstalled = a.binsInstalled || ok
	a.binsOK = ok
	return !ok || contested
}

func hintForWriteError(err error) string {
	if errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return "the directory is not writable: check the hostPath mount and SELinux; " + retryHint
	}
	return retryHint
}

// reconcileKubeconfig writes the plugin's kubeconfig where it is missing or not
// what it should be, and reports whether to try again later.
func (a *agent) reconcileKubeconfig() (retry bool) {
	err := a.writeKubeconfig()
	if errors.Is(err, errContested) {
		// Another agent's kubeconfig is in place, and works for the plugin meanwhile.
		return true
	}
	if errors.Is(err, errTokenPending) {
		// Every start's first reconcile comes before the token source's first answer:
		// a wait, not a failed step. Not ready meanwhile; tried again as a failure is,
		// so that a request that fails is then reported as one.
		a.kubeOK = false
		a.report("plugin token", err, a.kubeconfigKept())
		return true
	}
	if errors.Is(err, errTokenRefused) {
		// The kubeconfig holds the only token there is, which the API server refuses.
		// The token source logged it, requests a new one and wakes the loop when
		// anything changes; nothing to try again here. Not ready while it does only
		// where the plugin has no other way to its pods: with the pod cache, only
		// the ADDs the cache cannot answer need the token, and a node not ready is
		// tainted (TAINT_ENABLED), every node at once when the ServiceAccount is
		// deleted, which would stop every node's pods for the few that would fail.
		a.kubeOK = a.s.PodCache
		a.m.tokenRefused.Set(1)
		a.clearReport("kubeconfig")
		a.clearReport("plugin token")
		a.report(keyTokenRefused, err, "")
		return false
	}
	a.m.tokenRefused.Set(0)
	if err != nil {
		a.kubeOK = false
		a.m.installFailed(installKubeconfigFailed)
		a.report("kubeconfig", err, a.kubeconfigKept()+"; retrying when the token or CA changes, and "+retryHint)
		return true
	}
	a.clearReport("kubeconfig")
	a.clearReport("plugin token")
	a.clearReport(keyTokenRefused)
	a.kubeOK = true
	return false
}

// kubeconfigNotWritten says, for /readyz, that this agent has not written the
// plugin's kubeconfig yet, and whether an earlier agent's is in place meanwhile: an
// agent that starts while the API server cannot be reached has no token to write,
// and the kubeconfig of the agent before it is still there, still used.
func (a *agent) kubeconfigNotWritten() string {
	if !a.kubeconfigInPlace() {
		return "the plugin's kubeconfig " + a.s.KubeconfigPath() + " is not written"
	}
	return "the plugin's kubeconfig " + a.s.KubeconfigPath() + " is not written by this agent yet (an earlier agent's is in place, and the plugin uses it meanwhile)"
}

// kubeconfigInPlace reports whether a kubeconfig for the plugin is at its path:
// this agent's, or an earlier one's that it has not replaced yet.
func (a *agent) kubeconfigInPlace() bool {
	_, err := os.Lstat(a.s.KubeconfigPath())
	return err == nil
}

// kubeconfigKept says what the plugin uses while its kubeconfig cannot be
// written: the one in place, if any (a first install has none).
func (a *agent) kubeconfigKept() string {
	if !a.kubeconfigInPlace() {
		return "no kubeconfig for the plugin is in place yet"
	}
	return "the plugin keeps the previous kubeconfig"
}

// errContested says a write was put off: another writer keeps changing the file
// (mayOverwrite).
var errContested = errors.New("put off: another writer keeps changing the file")

// errTokenPending says the plugin's first token has not come yet and no request
// for it has failed.
var errTokenPending = errors.New("waiting for the plugin's token")

// errTokenRefused says the kubeconfig is in place with the plugin's token, which
// the API server refuses (refusal says why).
var errTokenRefused = errors.New("the API server refuses the plugin's token")

// keyTokenRefused is the report key of errTokenRefused: not logged by report (the
// token source logs each change of the refusal), it is the readiness' reason.
const keyTokenRefused = "plugin token refused"

func (a *agent) writeKubeconfig() error {
	token, ca, err := readCredentials(a.s)
	if err != nil {
		return err
	}
	var refused string
	if a.tokens != nil {
		// The agent's own token, which the kubelet renews, names this node as it is
		// now: the plugin's token may be bound to an earlier node of this name.
		if own, err := readCredential(a.s.TokenFile()); err == nil {
			a.tokens.ownTokenSeen(own)
		}
		tok, failure, r := a.tokens.current()
		if tok == nil {
			// The kubeconfig a previous agent wrote stays: its token is bound to the node,
			// not to that agent's pod, and the plugin keeps using it meanwhile.
			if failure != nil {
				return fmt.Errorf("no plugin token: %w", failure)
			}
			return fmt.Errorf("%w (TokenRequest for ServiceAccount %s/%s)", errTokenPending, a.s.PodNamespace, a.s.PluginServiceAccount)
		}
		token, refused = tok.token, r
	}
	if err := a.putKubeconfig(token, ca); err != nil {
		return err
	}
	if refused != "" {
		return fmt.Errorf("%w: %s", errTokenRefused, refused)
	}
	return nil
}

// putKubeconfig writes the plugin's kubeconfig with token and ca where it is
// missing or holds anything else, unless another writer keeps changing it.
func (a *agent) putKubeconfig(token, ca []byte) error {
	data, err := Kubeconfig(a.s, token, ca)
	if err != nil {
		return err
	}
	path := a.s.KubeconfigPath()
	_, statErr := os.Stat(path)
	// Tightened (or loosened) before new content goes in.
	if err := setOwnMode(path, a.s.KubeconfigMode); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if cniconf.SameContent(path, data) {
		a.kubeconfigLast = data
		return nil
	}
	// Content this agent did not write (not its previous token's either) is another
	// writer's: put back at once the first few times, then spaced out.
	theirs := statErr == nil && (a.kubeconfigLast == nil || !cniconf.SameContent(path, a.kubeconfigLast))
	if theirs && !a.mayOverwrite(path, time.Now()) {
		return errContested
	}
	if err := cniconf.WriteAtomic(path, data, a.s.KubeconfigMode); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	a.kubeconfigLast = data
	a.m.kubeconfigWrites.Inc()
	verb := "wrote"
	if a.kubeconfigWritten {
		verb = "rewrote (token or CA changed)"
	}
	a.kubeconfigWritten = true
	if !theirs || !a.contested(path) {
		a.log.Info(verb+" the plugin's kubeconfig", "path", path, "mode", fmt.Sprintf("%#o", a.s.KubeconfigMode))
	}
	return nil
}

// report logs err once per key until it changes or is cleared.
func (a *agent) report(key string, err error, hint string) {
	msg := err.Error()
	if a.reported[key] == msg {
		return
	}
	a.reported[key] = msg
	attrs := []any{"error", msg}
	if hint != "" {
		attrs = append(attrs, "hint", hint)
	}
	switch key {
	case "primary":
		a.log.Info("waiting for the primary CNI config", attrs...)
		return
	case "plugin token":
		a.log.Info("waiting for the plugin's token", attrs...)
		return
	case keyTokenRefused:
		return
	case keyNode:
		a.log.Error("this node cannot run the plugin's rule backend: every meshed pod's ADD fails here", attrs...)
		return
	}
	a.log.Error("install step failed", attrs...)
}

func (a *agent) clearReport(key string) {
	delete(a.reported, key)
	delete(a.unsettled, key)
}

// settleDelay is how long a broken config must stay broken to be reported.
const settleDelay = time.Second

type unsettledError struct {
	msg   string
	since time.Time
}

// settled reports whether err under key has lasted settleDelay; the first time it
// is seen, a one-shot timer asks for a recheck.
func (a *agent) settled(key string, err error) bool {
	u, ok := a.unsettled[key]
	if ok && u.msg == err.Error() {
		return time.Since(u.since) >= settleDelay
	}
	a.unsettled[key] = unsettledError{msg: err.Error(), since: time.Now()}
	time.AfterFunc(settleDelay, func() {
		select {
		case a.recheck <- struct{}{}:
		default:
		}
	})
	return false
}

// clearReportsExcept forgets skip reports for files no longer skipped, and says so
// of those it had logged: the error would otherwise be the log's last word on the
// file.
func (a *agent) clearReportsExcept(prefix string, skipped []cniconf.Skipped) {
	stale := func(key string) bool {
		name, ok := strings.CutPrefix(key, prefix)
		return ok && !slices.ContainsFunc(skipped, func(s cniconf.Skipped) bool { return s.Name == name })
	}
	for key := range a.reported {
		if stale(key) {
			delete(a.reported, key)
			a.log.Info("CNI config no longer skipped: it parses now, is gone, or sorts after the primary", "file", filepath.Join(a.s.MountedNetDir, strings.TrimPrefix(key, prefix)))
		}
	}
	for key := range a.unsettled {
		if stale(key) {
			delete(a.unsettled, key)
		}
	}
}

// removeStaleConfTemps deletes temporary files a crashed writer left in the config
// dir (WriteAtomic's ".NAME.tmp-*" of a config or of a backup); they are never
// loaded, but they are clutter.
func removeStaleConfTemps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, ".") {
			continue
		}
		i := strings.LastIndex(n, ".tmp-")
		if i < 0 {
			continue
		}
		if ext := filepath.Ext(n[:i]); slices.Contains(cniconf.Extensions, ext) || ext == ".orig" {
			livetemp.RemoveAbandoned(filepath.Join(dir, n))
		}
	}
}

// removeStaleRunDirFiles deletes what a killed agent or plugin left in the run
// directory: a half-written kubeconfig or TLS session (".NAME.tmp-*"), the
// directory of a socket being made (unixsock.TempDirPrefix) and a node check's
// probe locks (plugin.ProbeDirPrefix), each unless a live writer holds it
// (livetemp), and, when this agent keeps no pod
// cache, the pod files of an agent that did. No plugin reads them (no live agent
// holds their lock, kube.AgentPodFilesLock), but nothing else would remove them.
func removeStaleRunDirFiles(s *Settings, log *slog.Logger) {
	entries, _ := os.ReadDir(s.RunDir)
	for _, e := range entries {
		switch n := e.Name(); {
		case kube.IsSessionFileTemp(n, plugin.KubeconfigName) || kube.IsSessionFileTemp(n, plugin.TLSSessionName),
			e.IsDir() && unixsock.IsTemp(n): // a socket being made
			livetemp.RemoveAbandoned(filepath.Join(s.RunDir, n))
		}
	}
	// The plugin's: the node's iptables-nft version being written (its GC removes
	// them too, but containerd does not run GC).
	iptables.RemoveAbandonedVersionTemps(filepath.Join(s.RunDir, plugin.XtablesDirName))
	// A node check's kernel probe cut short by the agent's death: its lock directory.
	if n := plugin.RemoveAbandonedProbeDirs(s.RunDir); n > 0 {
		log.Info("removed the lock directories of node checks a killed agent left", "dir", filepath.Join(s.RunDir, plugin.XtablesDirName), "count", n)
	}
	if !s.PodCache {
		dir := filepath.Join(s.RunDir, kube.AgentPodFilesDir)
		if _, err := os.Lstat(dir); err == nil {
			if err := os.RemoveAll(dir); err != nil {
				log.Warn("could not remove the pod files an earlier agent left; the plugin may read them", "dir", dir, "error", err)
			} else {
				log.Info("removed the pod files an earlier agent left (this agent keeps no pod cache)", "dir", dir)
			}
		}
	}
}

// removeTLSSession removes the plugin's TLS session to the API server from the run
// directory (plugin.TLSSessionName), and a temporary file of it that a killed
// plugin left: it is made under the kubeconfig the agent removes.
func removeTLSSession(runDir string) error {
	var errs []error
	entries, _ := os.ReadDir(runDir)
	for _, e := range entries {
		if n := e.Name(); n == plugin.TLSSessionName || kube.IsSessionFileTemp(n, plugin.TLSSessionName) {
			if err := os.Remove(filepath.Join(runDir, n)); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("remove the plugin's TLS session: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeKubeconfig removes the plugin's kubeconfig unless it holds what another
// writer put there since this agent's last write (Istio's install-cni or another
// release, running beside this agent during a migration): removing theirs would
// leave their plugin without a kubeconfig until they noticed. When this agent
// never wrote one, the file is removed as before (a leftover of an earlier agent).
func (a *agent) removeKubeconfig() error {
	path := a.s.KubeconfigPath()
	if a.kubeconfigLast != nil && !cniconf.SameContent(path, a.kubeconfigLast) {
		if _, err := os.Lstat(path); err == nil {
			a.log.Info("kubeconfig left in place: it holds another writer's content", "path", path)
			return nil
		}
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove kubeconfig: %w", err)
	}
	return nil
}

// uninstall removes what the agent installed: the entry (or standalone file), the
// kubeconfig, the plugin's TLS session and the binaries but the plugin's own, which
// stays for the DELs of the pods it set up (libcni fails a DEL at the first binary
// of the chain it cannot find, before the primary's DEL runs: the pod stays
// Terminating and its address is never released). Every step runs even when
// another fails.
func (a *agent) uninstall() error {
	var errs []error
	if err := a.uninstallConfig(); err != nil {
		errs = append(errs, err)
	}
	if err := a.removeKubeconfig(); err != nil {
		errs = append(errs, err)
	}
	if err := removeTLSSession(a.s.RunDir); err != nil {
		errs = append(errs, err)
	}
	for _, dir := range a.binDirs {
		for _, b := range a.bins {
			if b.name == PluginType {
				// Kept: see the log line below.
				continue
			}
			if err := b.uninstall(dir, a.s.BinariesPrefix); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	a.log.Info("uninstalled: this agent's entry, kubeconfig and other binaries removed (a file another writer put in its place since is left); "+
		"the plugin binary stays: the runtime still runs its DEL for the pods it set up (CRI-O with the config they were set up with, "+
		"containerd until it reloads the config), and every DEL of a chain whose binary is missing fails, leaving the pod Terminating",
		"plugin", filepath.Join(a.binDirs[0], a.s.BinariesPrefix+PluginType))
	return nil
}

// listen opens a TCP listener on port (0: any free port).
// listen listens on port at addr, or at every address of the host's network
// namespace when addr is not set.
func listen(addr netip.Addr, port uint16) (net.Listener, error) {
	host := ""
	if addr.IsValid() {
		host = addr.String()
	}
	return net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
}
