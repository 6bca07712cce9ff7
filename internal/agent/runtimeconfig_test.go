package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// The tests here check the agent's readiness against the config the runtime loads:
// containerd and CRI-O take the first .conf, .conflist or .json of the conf dir in
// byte order that loads (CRI-O passes over one that does not).

// runtimeLoads returns the config of dir the runtime uses for pods, as libcni's
// ConfFiles, a sort and a load pick it; empty when none loads.
func runtimeLoads(t *testing.T, dir string) string {
	t.Helper()
	files, err := libcni.ConfFiles(dir, cniconf.Extensions)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	for _, f := range files {
		if filepath.Ext(f) == ".conflist" {
			if _, err := libcni.ConfListFromFile(f); err == nil {
				return f
			}
			continue
		}
		//nolint:staticcheck // as the runtimes load a single-plugin config
		if c, err := libcni.ConfFromFile(f); err == nil && c.Network.Type != "" {
			return f
		}
	}
	return ""
}

// pastSettle makes every broken config the agent has seen broken for longer than
// settleDelay, as the recheck a second later finds it.
func pastSettle(a *agent) {
	for k, u := range a.unsettled {
		u.since = u.since.Add(-2 * settleDelay)
		a.unsettled[k] = u
	}
}

// TestAWrapNeverSortsThePrimaryAfterAnotherConfig: wrapping NAME.conf into
// NAME.conflist moves it after any config named between the two in byte order
// (NAME.conf-backup.json, NAME.conf.json), which the runtime then loads instead:
// before, the agent said ready while the runtime used that other file, without the
// entry, and, at each change, moved its entry there and put NAME.conf back, which
// sorts first again, and so on. The wrap is refused naming the other file.
func TestAWrapNeverSortsThePrimaryAfterAnotherConfig(t *testing.T) {
	for _, other := range []string{"10-flannel.conf-backup.json", "10-flannel.conf.json", "10-flannel.confz.conf"} {
		t.Run(other, func(t *testing.T) {
			a := configAgent(t)
			dir := a.s.MountedNetDir
			writeFiles(t, dir, map[string]string{"10-flannel.conf": flannelConf, other: flannelConf})
			for range 3 { // each write of the agent is a change in the dir
				a.reconcile(dirtyConfig)
				pastSettle(a)
			}
			loaded := runtimeLoads(t, dir)
			if base := filepath.Base(loaded); base != "10-flannel.conf" && base != "10-flannel.conflist" {
				t.Errorf("the runtime loads %s now, not flannel's 10-flannel.conf(list); the dir holds %v", base, names(t, dir))
			}
			if a.ready.Load() && !hasEntryLast(loaded) {
				t.Errorf("ready, with the entry in %s, but the runtime loads %s, which lacks it", a.cfg.current, loaded)
			}
			if !a.ready.Load() {
				if why := *a.whyNotReady.Load(); !strings.Contains(why, other) {
					t.Errorf("not ready for %q, which does not name %s", why, other)
				}
			}
		})
	}
}

// TestALinkedConfIsNotWrappedAway: a primary that keeps its .conf elsewhere and
// links it into the conf dir rewrites the file the link points to; wrapping the
// .conf into a .conflist removed the link, so the runtime kept a copy those
// writes never reach (and the uninstall put back a regular file, not the link),
// while the agent said ready. The link stays a link, and the agent is ready only
// if the config read through it holds the entry.
func TestALinkedConfIsNotWrappedAway(t *testing.T) {
	a := configAgent(t)
	dir := a.s.MountedNetDir
	target := filepath.Join(t.TempDir(), "10-flannel.conf")
	if err := os.WriteFile(target, []byte(flannelConf), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "10-flannel.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	a.reconcile(dirtyConfig)
	pastSettle(a)
	a.reconcile(dirtyConfig)

	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("%s is no longer a link (%v); the dir holds %v", link, err, names(t, dir))
	}
	loaded := runtimeLoads(t, dir)
	if a.ready.Load() && (loaded != link || !hasEntryLast(loaded)) {
		t.Errorf("ready, with the entry in %s, but the runtime loads %s, which the primary's writes to %s do not reach or which lacks the entry", a.cfg.current, loaded, target)
	}
	if !a.ready.Load() {
		if why := *a.whyNotReady.Load(); !strings.Contains(why, "10-flannel.conf") || !strings.Contains(why, "symbolic link") {
			t.Errorf("not ready for %q, which does not name the link", why)
		}
	}
}

// TestALinkThisContainerCannotFollowIsNotPassedOver: a config that is a symbolic
// link to a file outside what the agent's container mounts (the runtime, on the
// host, follows it) was passed over as a file that is gone: the entry went into a
// later file and the agent said ready, while the runtime used the link. As for a
// file that cannot be read, nothing is known of its content: the agent writes
// nothing, is not ready and names the link, until the link resolves or goes.
func TestALinkThisContainerCannotFollowIsNotPassedOver(t *testing.T) {
	a := configAgent(t)
	dir := a.s.MountedNetDir
	target := filepath.Join(t.TempDir(), "not-mounted", "10-calico.conflist")
	link := filepath.Join(dir, "10-calico.conflist")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"99-loopback.conf": loopbackConf})
	before := names(t, dir)
	a.reconcile(dirtyConfig)
	pastSettle(a)
	a.reconcile(dirtyConfig)

	if got := names(t, dir); !slicesEqual(got, before) {
		t.Errorf("the dir changed to %v, from %v: the entry went past the link the runtime uses", got, before)
	}
	if a.ready.Load() {
		t.Errorf("ready, with the entry in %s, while the runtime uses the link 10-calico.conflist", a.cfg.current)
	} else if why := *a.whyNotReady.Load(); !strings.Contains(why, "10-calico.conflist") || !strings.Contains(why, target) {
		t.Errorf("not ready for %q, which does not name the link and where it points", why)
	}

	// The link's file comes into view: the entry goes there.
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte(calicoList), 0o644); err != nil {
		t.Fatal(err)
	}
	a.reconcile(a.retryDirty | dirtyConfig)
	if !a.ready.Load() || a.cfg.current != link || !hasEntryLast(link) {
		t.Errorf("once the link resolves: ready %v, entry in %s; want ready, in %s", a.ready.Load(), a.cfg.current, link)
	}
	want := append([]string{filepath.Base(cniconf.BackupPath(dir, "10-calico.conflist"))}, before...)
	if got := names(t, dir); !slicesEqual(got, want) {
		t.Errorf("once the link resolves the dir is %v, want %v", got, want)
	}
}

// TestACNIConfNameTheRuntimeDoesNotLoadFirstIsWarnedOf: CNI_CONF_NAME naming a
// config that another sorts before gets the entry, as Istio's install-cni puts it
// there (with Multus, 00-multus.conf delegates to that config), but the runtime
// loads the first: pods are redirected only if it delegates. Before, nothing said
// so; Istio's install-cni warns that the file is preempted. The agent warns once,
// naming both files, not at every reconcile.
func TestACNIConfNameTheRuntimeDoesNotLoadFirstIsWarnedOf(t *testing.T) {
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	a.s.ConfName = "10-calico.conflist"
	dir := a.s.MountedNetDir
	writeFiles(t, dir, map[string]string{"05-other.conflist": calicoList, "10-calico.conflist": calicoList})
	for range 3 {
		a.reconcile(dirtyConfig)
	}
	if !a.ready.Load() || a.cfg.current != filepath.Join(dir, "10-calico.conflist") {
		t.Fatalf("ready %v, entry in %s; want ready, in CNI_CONF_NAME's 10-calico.conflist", a.ready.Load(), a.cfg.current)
	}
	var warns []string
	for _, line := range strings.Split(agentLog.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "05-other.conflist") && strings.Contains(line, "10-calico.conflist") {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 {
		t.Errorf("%d warnings naming 05-other.conflist and 10-calico.conflist, want 1; the log:\n%s", len(warns), agentLog.String())
	}

	// The first config goes: the warning's subject ends, and a new one is warned of.
	if err := os.Remove(filepath.Join(dir, "05-other.conflist")); err != nil {
		t.Fatal(err)
	}
	a.reconcile(dirtyConfig)
	writeFiles(t, dir, map[string]string{"01-new.conflist": calicoList})
	a.reconcile(dirtyConfig)
	if !strings.Contains(agentLog.String(), "01-new.conflist") {
		t.Errorf("no warning names 01-new.conflist, which the runtime now loads first:\n%s", agentLog.String())
	}
}
