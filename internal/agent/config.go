package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

// standaloneCNIVersion is the spec version of the standalone config: Istio's, which
// every runtime in use reads.
const standaloneCNIVersion = "0.3.1"

// configState is what the agent knows about its entry in the node's CNI config.
type configState struct {
	// current is the config file holding our entry, empty before the first install.
	current string
	// inPlace says the last reconcile left our entry in place.
	inPlace bool
	// installed says the entry was in place once (written by this agent, or found
	// where an earlier agent left it): every later write is a re-insert.
	installed bool
	// reverts are the times the entry had to be put back, within the warning window.
	reverts  []time.Time
	lastWarn time.Time
	// lastWrite is when the agent last wrote the entry; quickDrops the re-inserts
	// of an entry dropped within fightLifetime of that write (fightingPrimary).
	lastWrite  time.Time
	quickDrops []time.Time
	// recheckAt is when the pending recheck of a contested entry's readiness fires
	// (fightingPrimary); zero or past when none is pending.
	recheckAt time.Time
	// preemptedBy is the config the runtime loads before CNI_CONF_NAME's, as last
	// warned of (notePreempted); empty when there is none.
	preemptedBy string
}

// fightLifetime: an entry the primary drops within this of its write was dropped
// because it was written (a primary that rewrites its config at every change in
// the directory), not by a rewrite of its own schedule.
const fightLifetime = time.Second

// configResult says what a reconcile did.
type configResult int

const (
	configUnchanged configResult = iota // our entry was in place
	configInstalled                     // written where it was missing
	configWaiting                       // no primary config yet
	configContested                     // another istio-cni writer's content stays for now (mayOverwrite)
)

// reconcileConfig makes the node's config hold our entry (chained) or our own file
// (standalone), writing only when something is missing.
func (a *agent) reconcileConfig() (configResult, error) {
	if !a.s.Chained {
		return a.reconcileStandalone()
	}
	dir := a.s.MountedNetDir
	path, skipped, err := cniconf.FindPrimary(dir, a.s.ConfName)
	unsettled := false
	for _, sk := range skipped {
		err := fmt.Errorf("CNI config %s left untouched: %w", filepath.Join(dir, sk.Name), sk.Err)
		if !a.settled("skip:"+sk.Name, err) {
			unsettled = true
			continue
		}
		a.report("skip:"+sk.Name, err, "a runtime that skips it uses a later file (containerd fails every pod's network instead); fix or remove it")
	}
	a.clearReportsExcept("skip:", skipped)
	if unsettled && errors.Is(err, cniconf.ErrNoPrimary) {
		// Every candidate is broken, one of them for less than settleDelay: most
		// likely the primary being written in place. A moment, not worth a line nor
		// a change of readiness; settled has asked for a recheck.
		return configWaiting, nil
	}
	if errors.Is(err, cniconf.ErrNoPrimary) {
		a.cfg.inPlace = false
		a.report("primary", fmt.Errorf("waiting for the primary CNI's config: %w", err), "")
		return configWaiting, nil
	}
	if err != nil {
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("CNI config left untouched: %w", err)
	}
	a.clearReport("primary")
	if a.s.ConfName != "" {
		a.notePreempted(path)
	}
	if unsettled {
		// A file that sorts before path has been broken for less than settleDelay:
		// most likely its CNI is writing it in place, and it is the primary. Choosing
		// path now would put the entry where the runtime will not look, and move it
		// again a moment later; settled has asked for a recheck. A file still broken
		// then is passed over, as Istio's install-cni passes it over.
		return configWaiting, nil
	}
	name := filepath.Base(path)
	data, err := cniconf.ReadConfig(path)
	if err != nil {
		a.cfg.inPlace = false
		return configWaiting, err
	}
	out, outName, err := cniconf.Insert(data, name, a.entry)
	if err == nil {
		err = speaksVersionOf(out)
	}
	if err != nil {
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("CNI config %s left untouched: %w", path, err)
	}
	if outName == name && bytes.Equal(out, data) {
		a.moveFrom(path)
		a.cfg.current, a.cfg.inPlace, a.cfg.installed = path, true, true
		return configUnchanged, nil
	}
	has, _ := cniconf.HasType(data, name, a.s.PluginName())
	if has && !a.mayOverwrite(path, time.Now()) {
		// An entry of our type is in the chain, only not ours byte for byte: the
		// runtime runs the plugin meanwhile.
		a.cfg.current, a.cfg.inPlace = path, true
		return configContested, nil
	}
	var written string
	err = whileChanged(func() (err error) {
		written, err = cniconf.Install(dir, name, a.entry)
		return err
	})
	if err != nil {
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("install into CNI config %s: %w", path, err)
	}
	a.moveFrom(written)
	a.cfg.current, a.cfg.inPlace = written, true
	a.noteInstall(written, has)
	return configInstalled, nil
}

// notePreempted warns, once for each such file, when the runtime loads another
// config than CNI_CONF_NAME's path (the first valid one of the dir in byte order):
// the entry goes where CNI_CONF_NAME says, as Istio's install-cni puts it (which
// warns the file is preempted), and is right there when the first config delegates
// to path (Multus); otherwise pods are not redirected.
func (a *agent) notePreempted(path string) {
	first, _, err := cniconf.FindPrimary(filepath.Dir(path), "")
	if err != nil || first == path {
		a.cfg.preemptedBy = ""
		return
	}
	if first == a.cfg.preemptedBy {
		return
	}
	a.cfg.preemptedBy = first
	a.log.Warn(fmt.Sprintf("the runtime loads %s, not CNI_CONF_NAME's %s, which gets the istio-cni entry: pods are redirected only if %s delegates to %s (Multus); otherwise set CNI_CONF_NAME to %s or leave it empty",
		filepath.Base(first), filepath.Base(path), filepath.Base(first), filepath.Base(path), filepath.Base(first)),
		"file", path, "first", first)
}

// moveFrom takes our entry out of the file that held it when the primary config is
// now another file (a new config sorts first, or CNI_CONF_NAME's .conf came back),
// or when this agent is standalone and now is its own file. Before this agent's
// first install that file is an earlier agent's (earlierHolders): one killed
// between its write into the new primary and the take-out, or while the primary
// moved, left its entry there, and so does a chained agent replaced by a
// standalone one (a helm upgrade that sets chained=false: the old agent keeps its
// entry on exit). An earlier standalone agent's own file goes too: chained, every
// one; standalone, one under another name (a helm upgrade that changed
// cniConfFileName), which would otherwise stay, also after the uninstall.
func (a *agent) moveFrom(now string) {
	olds := []string{a.cfg.current}
	if a.cfg.current == "" {
		olds = a.earlierHolders(now)
		keep := ""
		if !a.s.Chained {
			keep = now
		}
		a.removeEarlierStandalone(filepath.Dir(now), keep)
	}
	for _, old := range olds {
		if old == "" || old == now {
			continue
		}
		if _, err := a.uninstallFrom(old); errors.Is(err, fs.ErrNotExist) {
			continue // gone, and the original kept of it with it
		} else if err != nil {
			a.log.Warn("the istio-cni entry belongs in another CNI config now; our entry stays in the old file", "old", old, "new", now, "error", err)
			continue
		}
		a.log.Info("the istio-cni entry belongs in another CNI config now; took our entry out of the old file", "old", old, "new", now)
	}
}

// removeEarlierStandalone deletes the standalone configs of ours in dir (a single
// plugin of our type, which no chained install writes) but keep: an earlier agent
// of the standalone mode left its file when a helm upgrade set chained=true or
// changed the standalone file's name, and the uninstall of this agent would leave
// it behind: a config the runtime runs the plugin for, with no kubeconfig, failing
// the ADD of every pod it applies to.
func (a *agent) removeEarlierStandalone(dir, keep string) {
	why := "this agent is chained"
	if keep != "" {
		why = "this agent's standalone config is " + filepath.Base(keep)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if ext := filepath.Ext(e.Name()); path == keep || ext != ".conf" && ext != ".json" {
			continue
		}
		if data, err := cniconf.ReadConfig(path); err != nil || !a.isOurs(data) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("an earlier standalone agent's config stays", "file", path, "reason", why, "error", err)
			continue
		}
		a.log.Info("removed an earlier standalone agent's config", "file", path, "reason", why)
	}
}

// earlierHolders lists the configs beside now that an earlier agent inserted our
// entry into: they hold an entry of our type and the backup Install keeps of the
// primary's original (a config another installer edited has none, and stays).
func (a *agent) earlierHolders(now string) []string {
	dir := filepath.Dir(now)
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if path == now || !slices.Contains(cniconf.Extensions, filepath.Ext(name)) {
			continue
		}
		if orig, err := cniconf.FindBackup(dir, name); err != nil || orig == nil {
			continue
		}
		data, err := cniconf.ReadConfig(path)
		if err != nil {
			continue
		}
		if has, _ := cniconf.HasType(data, name, a.s.PluginName()); has {
			out = append(out, path)
		}
	}
	return out
}

// noteInstall counts a write of our entry; replaced says an entry of our type was
// there, only not ours (another agent's, or an earlier version's). Every write after
// the first that was not such a replacement is a re-insert: something dropped the
// entry. When that happens too often the agent warns: every pod created between a
// rewrite and the re-insert is missed.
func (a *agent) noteInstall(path string, replaced bool) {
	if a.cfg.installed && replaced {
		if !a.contested(path) {
			a.log.Info("replaced an istio-cni entry that differed from this agent's", "file", path)
		}
		return
	}
	a.m.installs.WithLabelValues(installSuccess).Inc()
	now := time.Now()
	prev := a.cfg.lastWrite
	a.cfg.lastWrite = now
	if !a.cfg.installed {
		a.cfg.installed = true
		return
	}
	a.m.reinserts.Inc()
	if now.Sub(prev) < fightLifetime {
		a.cfg.quickDrops = append(a.cfg.quickDrops, now)
		if len(a.cfg.quickDrops) > 2*a.s.RevertWarnCount+2 {
			a.cfg.quickDrops = slices.Delete(a.cfg.quickDrops, 0, len(a.cfg.quickDrops)-a.s.RevertWarnCount-1)
		}
	}
	kept := a.cfg.reverts[:0]
	for _, t := range a.cfg.reverts {
		if now.Sub(t) < a.s.RevertWarnWindow {
			kept = append(kept, t)
		}
	}
	a.cfg.reverts = append(kept, now)
	if len(a.cfg.reverts) <= a.s.RevertWarnCount {
		// Beyond, the warning speaks for them once a window: a primary rewriting its
		// file every second would otherwise log thousands of lines an hour.
		a.log.Info("put the istio-cni entry back into the CNI config", "file", path)
	}
	if len(a.cfg.reverts) > a.s.RevertWarnCount && now.Sub(a.cfg.lastWarn) >= a.s.RevertWarnWindow {
		a.cfg.lastWarn = now
		a.log.Warn(fmt.Sprintf("the primary CNI keeps rewriting %s without the istio-cni entry (%d times in %s); "+
			"pods created between a rewrite and our re-insert are not redirected, and this agent is not ready until that stops. "+
			"Configure the primary CNI to keep chained plugins (Cilium: cni.exclusive=false; Calico's and others' CNI config options), "+
			"or point CNI_CONF_NAME at the file it keeps",
			filepath.Base(path), len(a.cfg.reverts), a.s.RevertWarnWindow),
			"file", path)
	}
}

// fightingPrimary says whether the primary CNI has dropped the entry within
// fightLifetime of its write more than RevertWarnCount times within the last
// RevertWarnWindow: a primary that rewrites its config at every change in the
// directory (Cilium with cni.exclusive=true) leaves the entry out almost all the
// time however fast it is put back, so pods the kubelet starts here are not
// redirected. The agent is not ready meanwhile (with the readiness taint, no new
// pod comes to the node), and ready again once a window passes with no more than
// RevertWarnCount such drops: a recheck is scheduled for that moment, as no event
// may come then. A primary that rewrites on a schedule of its own (every few
// seconds or less often) leaves the entry in place nearly all the time and only
// warns (noteInstall).
func (a *agent) fightingPrimary(now time.Time) (fighting bool, count int) {
	var recent []time.Time
	for _, t := range a.cfg.quickDrops {
		if now.Sub(t) < a.s.RevertWarnWindow {
			recent = append(recent, t)
		}
	}
	if len(recent) <= a.s.RevertWarnCount {
		return false, len(recent)
	}
	if now.After(a.cfg.recheckAt) {
		// The moment the count falls back to RevertWarnCount if no re-insert comes.
		a.cfg.recheckAt = recent[len(recent)-1-a.s.RevertWarnCount].Add(a.s.RevertWarnWindow)
		time.AfterFunc(a.cfg.recheckAt.Sub(now), func() {
			select {
			case a.recheck <- struct{}{}:
			default:
			}
		})
	}
	return true, len(recent)
}

// ChangedTries is how many times the agent tries an edit of a CNI config (its
// install or its uninstall) that found the file changed between its read and its
// write (cniconf.ErrChanged): the primary CNI's daemon rewriting its file at that
// moment. Each try reads the file anew.
const ChangedTries = 4

// whileChanged runs edit until it succeeds, fails for another reason than
// cniconf.ErrChanged, or has been tried ChangedTries times.
func whileChanged(edit func() error) error {
	var err error
	for try := 0; try < ChangedTries; try++ {
		if err = edit(); !errors.Is(err, cniconf.ErrChanged) {
			return err
		}
	}
	return err
}

// uninstallFrom takes every entry of our type out of path, restoring a wrapped
// .conf from its backup when the file is still what we made of it.
func (a *agent) uninstallFrom(path string) (string, error) {
	dir, name := filepath.Split(path)
	return cniconf.UninstallType(filepath.Clean(dir), name, a.s.PluginName())
}

// standalonePath is the agent's own config file in standalone mode.
func (a *agent) standalonePath() string {
	name := a.s.ConfName
	if name == "" {
		name = DefaultStandaloneName
	}
	return filepath.Join(a.s.MountedNetDir, name)
}

func (a *agent) reconcileStandalone() (configResult, error) {
	path := a.standalonePath()
	want, err := cniconf.Standalone(a.entry, standaloneCNIVersion, a.s.StandaloneNetworkName())
	if err != nil {
		return configWaiting, fmt.Errorf("standalone config: %w", err)
	}
	mode := a.s.StandaloneConfMode()
	if cniconf.SameContent(path, want) {
		if err := setOwnMode(path, mode); err != nil {
			a.cfg.inPlace = false
			return configWaiting, fmt.Errorf("standalone config: %w", err)
		}
		a.moveFrom(path)
		a.cfg.current, a.cfg.inPlace, a.cfg.installed = path, true, true
		return configUnchanged, nil
	}
	// A runtime loads the first config of the dir in byte order: a standalone
	// istio-cni before the node's network would replace it as the pods' network.
	if after, err := cniconf.ConfigsAfter(filepath.Dir(path), filepath.Base(path)); err != nil {
		return configWaiting, fmt.Errorf("standalone config: %w", err)
	} else if len(after) > 0 {
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("standalone config %s not written: it would sort before %s in %s, and a runtime loads the first config in byte order as the node's network; set CNI_CONF_NAME (the chart's cniConfFileName) to a name that sorts after %s",
			filepath.Base(path), after[0], filepath.Dir(path), after[len(after)-1])
	}
	if a.s.Multus.Enabled {
		network := a.s.StandaloneNetworkName()
		if before, err := cniconf.NamedBefore(filepath.Dir(path), filepath.Base(path), network); err != nil {
			return configWaiting, fmt.Errorf("standalone config: %w", err)
		} else if len(before) > 0 {
			a.cfg.inPlace = false
			return configWaiting, fmt.Errorf("standalone config %s is not the one Multus uses: %s sorts before it in %s with the same network name %q, and Multus takes the first; remove or rename it",
				filepath.Base(path), before[0], filepath.Dir(path), network)
		}
	}
	replaced := false
	switch cur, err := cniconf.ReadConfig(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		// Unreadable or over the size a config may have: not ours to replace.
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("standalone config %s left untouched: %w", path, err)
	case !a.isOurs(cur):
		a.cfg.inPlace = false
		return configWaiting, fmt.Errorf("standalone config %s left untouched: it holds another plugin's config (set CNI_CONF_NAME to a free name)", path)
	case !a.mayOverwrite(path, time.Now()):
		// Another istio-cni config: the runtime runs the plugin meanwhile.
		a.cfg.current, a.cfg.inPlace = path, true
		return configContested, nil
	default:
		replaced = true
		if err := setOwnMode(path, mode); err != nil {
			a.cfg.inPlace = false
			return configWaiting, fmt.Errorf("standalone config: %w", err)
		}
	}
	if err := cniconf.WriteAtomic(path, want, mode); err != nil {
		a.cfg.inPlace = false
		return configWaiting, err
	}
	a.moveFrom(path)
	a.cfg.current, a.cfg.inPlace = path, true
	a.noteInstall(path, replaced)
	return configInstalled, nil
}

// setOwnMode gives a file of this agent's (the standalone config, the plugin's
// kubeconfig) at path mode, when it is there with another: an earlier agent may
// have written it with another setting or version, cniconf.WriteAtomic keeps an
// existing file's mode, and a file already holding the right content is not
// written again.
func setOwnMode(path string, mode os.FileMode) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() == mode {
		return nil // gone: written anew, with mode
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// isOurs reports whether a standalone config file is one of ours (any version):
// a single plugin of our type. Garbage is not ours: someone else's file stays.
func (a *agent) isOurs(data []byte) bool {
	var c struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(data, &c) == nil && c.Type == a.s.PluginName()
}

// leftToAnother says whether the config at path (its bytes data) holds an entry of
// our type that is not entry, this agent's, once this agent has installed its own:
// another writer's (a second agent, Istio's install-cni beside this one), which the
// uninstall leaves as it leaves another's kubeconfig and binary. Taken out, pods
// would start unredirected until that writer put it back.
func (a *agent) leftToAnother(path string, data, entry []byte) bool {
	if !a.cfg.installed {
		return false
	}
	name := filepath.Base(path)
	if has, err := cniconf.HasType(data, name, a.s.PluginName()); err != nil || !has {
		return false
	}
	if ours, err := cniconf.HoldsEntry(data, name, entry); err != nil || ours {
		return false
	}
	a.log.Info("istio-cni entry left in place: it holds another writer's content", "file", path)
	return true
}

// uninstallConfig takes our entry out (chained) or deletes our file (standalone).
func (a *agent) uninstallConfig() error {
	if !a.s.Chained {
		path := a.standalonePath()
		cur, err := cniconf.ReadConfig(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove standalone config: %w", err)
		}
		if !a.isOurs(cur) {
			return nil
		}
		if want, err := cniconf.Standalone(a.entry, standaloneCNIVersion, a.s.StandaloneNetworkName()); err == nil && a.leftToAnother(path, cur, want) {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove standalone config: %w", err)
		}
		return nil
	}
	if a.cfg.current == "" {
		return nil
	}
	var restored string
	left := false
	err := whileChanged(func() (err error) {
		// Judged again at each try: what changed the file may have been another
		// writer putting its own entry in.
		if cur, err := cniconf.ReadConfig(a.cfg.current); err == nil && a.leftToAnother(a.cfg.current, cur, a.entry) {
			left = true
			return nil
		}
		restored, err = a.uninstallFrom(a.cfg.current)
		return err
	})
	if left || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("take our entry out of %s: %w", a.cfg.current, err)
	}
	a.log.Info("took the istio-cni entry out of the CNI config", "file", restored)
	return nil
}

// speaksVersionOf refuses a chain whose cniVersion the plugin does not speak: the
// runtime would fail every pod's ADD with "incompatible CNI versions", so the agent
// says it now, names the version, and stays not ready instead.
func speaksVersionOf(list []byte) error {
	l, err := libcni.ConfListFromBytes(list)
	if err != nil {
		return err
	}
	supported := plugin.SupportedVersions.SupportedVersions()
	if l.CNIVersion == "" {
		// The runtime gives the chain's plugins no version, which they read as
		// 0.1.0 (the spec's default), as the plugin does.
		return fmt.Errorf("it names no cniVersion, which its plugins read as 0.1.0, a version istio-cni does not speak (%s): add a cniVersion to the primary network's config", strings.Join(supported, ", "))
	}
	if !slices.Contains(supported, l.CNIVersion) {
		return fmt.Errorf("its cniVersion %s is one istio-cni does not speak (%s): upgrade the primary network's config", l.CNIVersion, strings.Join(supported, ", "))
	}
	return nil
}
