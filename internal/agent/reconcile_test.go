package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/test/harness/lease"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/nofile"
)

// The reconcile tests run the agent's loop in-process on a conf dir of their own,
// with binaries and kubeconfig taken as done: only the config step runs.

const (
	calicoList   = `{"cniVersion":"0.3.1","name":"k8s","plugins":[{"type":"calico"}]}`
	loopbackConf = `{"cniVersion":"0.3.1","name":"lo","type":"loopback"}`
)

func configAgent(t *testing.T) *agent {
	t.Helper()
	s := &Settings{MountedNetDir: t.TempDir(), Chained: true, RevertWarnCount: 5, RevertWarnWindow: time.Minute}
	a := newAgent(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	a.entry = []byte(`{"name":"istio-cni","type":"istio-cni"}`)
	a.binsOK, a.kubeOK = true, true
	return a
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestHalfWrittenPrimaryIsWaitedFor: a file that sorts first and does not parse
// (a primary CNI writing it in place) holds the install back for settleDelay
// instead of putting the entry into a later file; once it parses, the entry goes
// into it. One still broken after settleDelay is passed over, as Istio's is.
func TestHalfWrittenPrimaryIsWaitedFor(t *testing.T) {
	a := configAgent(t)
	dir := a.s.MountedNetDir
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList[:40], "99-loopback.conf": loopbackConf})
	before := names(t, dir)
	res, err := a.reconcileConfig()
	if err != nil || res != configWaiting {
		t.Fatalf("half-written first file: %v, %v; want waiting", res, err)
	}
	if got := names(t, dir); !slicesEqual(got, before) {
		t.Errorf("while waiting the dir changed: %v, want %v", got, before)
	}

	// The primary finishes its write: the entry goes there.
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList})
	if res, err := a.reconcileConfig(); err != nil || res != configInstalled || a.cfg.current != filepath.Join(dir, "10-calico.conflist") {
		t.Fatalf("after the write: %v, %v, in %s; want installed in 10-calico.conflist", res, err, a.cfg.current)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "99-loopback.conf")); string(data) != loopbackConf {
		t.Errorf("99-loopback.conf changed: %s", data)
	}

	// Broken for longer than settleDelay: passed over.
	a = configAgent(t)
	dir = a.s.MountedNetDir
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList[:40], "99-loopback.conf": loopbackConf})
	if res, _ := a.reconcileConfig(); res != configWaiting {
		t.Fatalf("first look: %v, want waiting", res)
	}
	for k, u := range a.unsettled {
		u.since = u.since.Add(-2 * settleDelay)
		a.unsettled[k] = u
	}
	if res, err := a.reconcileConfig(); err != nil || res != configInstalled || a.cfg.current != filepath.Join(dir, "99-loopback.conflist") {
		t.Errorf("still broken after settleDelay: %v, %v, in %s; want installed in 99-loopback.conflist", res, err, a.cfg.current)
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFailedWriteIsRetried: an install step that fails for a reason no event
// announces (here the backup's path is taken by a non-empty directory, as a full
// disk or a read-only remount would fail it) is tried again without any change to
// the dir, and the agent becomes ready once the cause is gone.
func TestFailedWriteIsRetried(t *testing.T) {
	a := configAgent(t)
	dir := a.s.MountedNetDir
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList})
	blocker := cniconf.BackupPath(dir, "10-calico.conflist")
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.reconcile(dirtyConfig)
	if a.ready.Load() || !a.retryPending || a.retryDirty != dirtyConfig {
		t.Fatalf("after the failure: ready %v, retry pending %v for %b; want not ready and a retry of the config", a.ready.Load(), a.retryPending, a.retryDirty)
	}
	fw, err := fsnotify.NewWatcher() // watches nothing: only the retry can wake the loop
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.loop(ctx, &watcher{Watcher: fw}); close(done) }()
	defer func() { cancel(); <-done }()
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	// The first retry comes after retryMin; allow it many times over.
	for deadline := time.Now().Add(20 * retryMin); !a.ready.Load(); {
		if time.Now().After(deadline) {
			t.Fatalf("not ready %s after the cause went away: no retry", 20*retryMin)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUnreadablePrimaryKeepsTheEntry: the config holding our entry cannot be opened
// for longer than settleDelay (EAGAIN here; an agent out of descriptors gets EMFILE,
// a node out of them ENFILE): the agent reports the file and the cause, is not
// ready and tries again, and neither puts the entry into a later file nor takes it
// out of the primary; once the file opens again it is ready, nothing changed.
// Before, the file was passed over as a broken one: the entry went into a wrapped
// 99-loopback.conflist and the loopback's .conf was gone.
func TestUnreadablePrimaryKeepsTheEntry(t *testing.T) {
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	dir := a.s.MountedNetDir
	primary := filepath.Join(dir, "10-calico.conflist")
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList, "99-loopback.conf": loopbackConf})
	a.reconcile(dirtyConfig)
	if !a.ready.Load() || a.cfg.current != primary {
		t.Fatalf("first install: ready %v, entry in %s; want ready, in %s", a.ready.Load(), a.cfg.current, primary)
	}
	installed, err := os.ReadFile(primary)
	if err != nil {
		t.Fatal(err)
	}
	before := names(t, dir)

	release := lease.Hold(t, primary)
	a.reconcile(dirtyConfig)
	for k, u := range a.unsettled { // the settle recheck, a second later
		u.since = u.since.Add(-2 * settleDelay)
		a.unsettled[k] = u
	}
	a.reconcile(dirtyConfig)
	if got := names(t, dir); !slicesEqual(got, before) {
		t.Errorf("while the primary could not be opened the dir changed: %v, want %v", got, before)
	}
	if a.ready.Load() || a.retryDirty&dirtyConfig == 0 {
		t.Errorf("while the primary could not be opened: ready %v, retry of the config %v; want not ready and a retry", a.ready.Load(), a.retryDirty&dirtyConfig != 0)
	}
	if log := agentLog.String(); !strings.Contains(log, "10-calico.conflist") || !strings.Contains(log, "resource temporarily unavailable") {
		t.Errorf("the agent's log does not name the file and the cause:\n%s", log)
	}

	release()
	a.reconcile(a.retryDirty)
	if !a.ready.Load() || a.cfg.current != primary {
		t.Errorf("once it opens: ready %v, entry in %s; want ready, in %s", a.ready.Load(), a.cfg.current, primary)
	}
	if got := names(t, dir); !slicesEqual(got, before) {
		t.Errorf("once it opens the dir is %v, want %v", got, before)
	}
	if data, err := os.ReadFile(primary); err != nil || string(data) != string(installed) {
		t.Errorf("the primary now holds %s (%v), want what the install wrote:\n%s", data, err, installed)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "99-loopback.conf")); err != nil || string(data) != loopbackConf {
		t.Errorf("99-loopback.conf: %s (%v), want it untouched", data, err)
	}
}

// TestRetryBackoff: the delay doubles from retryMin to retryMax while a step keeps
// failing, one wake is pending at a time, and a success resets it.
func TestRetryBackoff(t *testing.T) {
	a := configAgent(t)
	var got []time.Duration
	for range 8 {
		a.retryPending = false // as the loop does when the wake arrives
		a.scheduleRetry(dirtyConfig, dirtyConfig)
		got = append(got, a.retryDelay)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("delays %v, want %v seconds", got, want)
		}
	}
	a.scheduleRetry(dirtyKubeconfig, dirtyKubeconfig) // pending already: no second wake
	if a.retryDelay != retryMax || a.retryDirty != dirtyConfig|dirtyKubeconfig {
		t.Errorf("a failure while a wake is pending: delay %s, dirty %b", a.retryDelay, a.retryDirty)
	}
	a.scheduleRetry(dirtyConfig|dirtyKubeconfig, 0)
	if a.retryDelay != 0 || a.retryDirty != 0 {
		t.Errorf("after success: delay %s, dirty %b; want both reset", a.retryDelay, a.retryDirty)
	}
}

// TestPrimaryKeepsItsOwner: the primary's config keeps its owner and group when
// the agent writes the entry into it (root: the agent chowns, as the chart runs it).
func TestPrimaryKeepsItsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test gives the primary's config another owner")
	}
	a := configAgent(t)
	dir := a.s.MountedNetDir
	p := filepath.Join(dir, "10-calico.conflist")
	writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList})
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if res, err := a.reconcileConfig(); err != nil || res != configInstalled {
		t.Fatalf("install: %v, %v", res, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("after the install the primary is %d:%d, want 1234:5678 kept", st.Uid, st.Gid)
	}
}

// TestStandaloneNameIsMultusNetwork: with Multus, the standalone config is named as
// the NetworkAttachmentDefinition (Multus finds a definition without a spec's
// config by that name); without, istio-cni.
func TestStandaloneNameIsMultusNetwork(t *testing.T) {
	for _, tc := range []struct {
		multus  bool
		network string
		want    string
	}{
		{true, "mesh-net", "mesh-net"},
		{false, "mesh-net", "istio-cni"},
	} {
		a := configAgent(t)
		a.s.Chained = false
		a.s.Multus.Enabled, a.s.Multus.Network = tc.multus, tc.network
		if res, err := a.reconcileConfig(); err != nil || res != configInstalled {
			t.Fatalf("standalone install: %v, %v", res, err)
		}
		data, err := os.ReadFile(a.standalonePath())
		if err != nil {
			t.Fatal(err)
		}
		var c struct{ Name string }
		if err := json.Unmarshal(data, &c); err != nil || c.Name != tc.want {
			t.Errorf("Multus %v, network %q: standalone config named %q (%v), want %q", tc.multus, tc.network, c.Name, err, tc.want)
		}
	}
}

// TestStandaloneRefusesAnEarlierConfigOfTheSameNetwork: with Multus, a config that
// sorts before the standalone one with the same network name (a leftover of an
// earlier install) is the one Multus would use: the agent is not ready and names
// it; once it is gone, the standalone config goes in.
func TestStandaloneRefusesAnEarlierConfigOfTheSameNetwork(t *testing.T) {
	a := configAgent(t)
	a.s.Chained = false
	a.s.Multus.Enabled, a.s.Multus.Network = true, "istio-cni"
	leftover := filepath.Join(a.s.MountedNetDir, "istio-cni.conf")
	writeFiles(t, a.s.MountedNetDir, map[string]string{"istio-cni.conf": `{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni"}`})
	res, err := a.reconcileConfig()
	if err == nil || res != configWaiting || a.cfg.inPlace || !strings.Contains(err.Error(), "istio-cni.conf sorts before it") {
		t.Fatalf("with an earlier config of the network: %v, %v, in place %v; want waiting and an error naming istio-cni.conf", res, err, a.cfg.inPlace)
	}
	if _, err := os.Stat(a.standalonePath()); err == nil {
		t.Errorf("the standalone config was written although Multus would not use it")
	}
	if err := os.Remove(leftover); err != nil {
		t.Fatal(err)
	}
	if res, err := a.reconcileConfig(); err != nil || res != configInstalled {
		t.Errorf("after the leftover went: %v, %v", res, err)
	}
}

// TestAWatchThatCannotStartNamesTheLimit: the kernel reports a used-up inotify
// limit as "too many open files" (instances) or "no space left on device"
// (watches); the agent's error, which ends its start and shows in its pod's log,
// names the sysctl. The first is provoked for real: the process out of descriptors.
func TestAWatchThatCannotStartNamesTheLimit(t *testing.T) {
	a := configAgent(t)
	a.s.RunDir, a.s.ServiceAccountDir = t.TempDir(), t.TempDir()
	release := nofile.Exhaust(t, 0)
	w, err := a.watch()
	release()
	if err == nil {
		w.Close()
		t.Fatal("watch started with no file descriptor left")
	}
	if !strings.Contains(err.Error(), "fs.inotify.max_user_instances") {
		t.Errorf("watch error %q does not name fs.inotify.max_user_instances", err)
	}
	if got := inotifyHint(fmt.Errorf("watch: %w", syscall.ENOSPC)); !strings.Contains(got, "fs.inotify.max_user_watches") {
		t.Errorf("hint for ENOSPC %q does not name fs.inotify.max_user_watches", got)
	}
}

// TestAWriteThatKeepsFailingIsLoggedOnce: a write that fails the same way at every
// retry after its temporary file is made (a binary's path taken by a non-empty
// directory here; a full disk, an I/O error or a busy path fail there as well) is
// one error line, not one per retry (1 s doubling to 30 s: 120 lines an hour per
// file). The error named the random temporary file, so no two retries' errors were
// alike and report's de-duplication never held.
func TestAWriteThatKeepsFailingIsLoggedOnce(t *testing.T) {
	src := filepath.Join(t.TempDir(), "istio-cni")
	writeFile(t, src, []byte("#!/bin/sh\n"), 0o755)
	size, sum, err := digest(src)
	if err != nil {
		t.Fatal(err)
	}
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	a.s.UpdateBinaries = true
	a.bins = []binary{{name: "istio-cni", src: src, size: size, sum: sum}}
	a.binDirs = []string{t.TempDir()}
	if err := os.MkdirAll(filepath.Join(a.binDirs[0], "istio-cni", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	const retries = 5
	for range retries {
		a.reconcile(dirtyBinaries)
		a.retryPending = false // as the loop does when the retry's wake arrives
	}
	if n := strings.Count(agentLog.String(), `msg="install step failed"`); n != 1 {
		t.Errorf("%d retries of a write failing the same way logged %d errors, want 1:\n%s", retries, n, agentLog.String())
	}
}

// TestAPrimaryThatKeepsRewritingIsNotLoggedAtEveryRewrite: a primary CNI that
// rewrites its config without the entry every second (a daemon's reconcile loop)
// had every re-insert logged twice ("put the istio-cni entry back", "the CNI config
// holds the istio-cni entry"): 7,200 lines an hour on the node. The put-backs are
// logged until there are more than REVERT_WARN_COUNT in REVERT_WARN_WINDOW; then
// the warning, once a window, speaks for them, and each is counted
// (istio_cni_config_reinserts_total).
func TestAPrimaryThatKeepsRewritingIsNotLoggedAtEveryRewrite(t *testing.T) {
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	primary := filepath.Join(a.s.MountedNetDir, "10-calico.conflist")
	writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
	a.reconcile(dirtyConfig)
	const rewrites = 20
	for range rewrites {
		writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
		a.reconcile(dirtyConfig)
		if !hasEntryLast(primary) {
			t.Fatalf("the entry is not back:\n%s", agentLog.String())
		}
	}
	log := agentLog.String()
	for _, c := range []struct {
		msg  string
		want int
	}{
		{`msg="the CNI config holds the istio-cni entry"`, 1}, // the first install
		{`msg="put the istio-cni entry back into the CNI config"`, a.s.RevertWarnCount},
		{`msg="the primary CNI keeps rewriting`, 1},
	} {
		if got := strings.Count(log, c.msg); got != c.want {
			t.Errorf("%d rewrites: %d lines %s, want %d", rewrites, got, c.msg, c.want)
		}
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", log)
	}
}

// TestTheEndOfASkippedConfigIsLogged: a config the agent skips (it does not parse)
// is logged at error; once it parses, or is gone, the log says so. It used to say
// nothing, so the last word of the log on that file was still the error: an
// operator reading it after the fix saw the file as broken.
func TestTheEndOfASkippedConfigIsLogged(t *testing.T) {
	for _, tc := range []struct {
		name string
		fix  func(path string) error
	}{
		{"fixed", func(path string) error { return os.WriteFile(path, []byte(loopbackConf), 0o644) }},
		{"removed", os.Remove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := configAgent(t)
			var agentLog logbuf.Buffer
			a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
			dir := a.s.MountedNetDir
			writeFiles(t, dir, map[string]string{"10-calico.conflist": calicoList, "05-bad.conf": loopbackConf[:20]})
			a.reconcile(dirtyConfig)
			for k, u := range a.unsettled { // the settle recheck, a second later
				u.since = u.since.Add(-2 * settleDelay)
				a.unsettled[k] = u
			}
			a.reconcile(dirtyConfig)
			if !strings.Contains(agentLog.String(), "05-bad.conf left untouched") {
				t.Fatalf("the broken file is not reported:\n%s", agentLog.String())
			}
			if err := tc.fix(filepath.Join(dir, "05-bad.conf")); err != nil {
				t.Fatal(err)
			}
			before := agentLog.String()
			a.reconcile(dirtyConfig)
			after := strings.TrimPrefix(agentLog.String(), before)
			if !strings.Contains(after, "level=INFO") || !strings.Contains(after, "05-bad.conf") {
				t.Errorf("nothing says 05-bad.conf is no longer skipped; the log ends:\n%s", agentLog.String())
			}
		})
	}
}

// TestAPrimaryRewrittenInPlaceIsNotLoggedForItsHalfWrittenMoment: a primary CNI that
// rewrites its only config in place (truncate, then write) shows a half-written
// file for a moment, which is not worth a line (settleDelay). Each such moment
// used to log "waiting for the primary CNI config" and two "readiness changed"
// lines, readiness flapping to false and back: for a daemon that rewrites every
// second, thousands of lines an hour saying nothing that lasted.
func TestAPrimaryRewrittenInPlaceIsNotLoggedForItsHalfWrittenMoment(t *testing.T) {
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
	a.reconcile(dirtyConfig)
	const rewrites = 10
	// The rewrites here follow each other within milliseconds, which is a primary
	// fighting the entry (TestAgentIsNotReadyWhileThePrimaryKeepsDroppingTheEntry);
	// this test is about the half-written moments alone.
	a.s.RevertWarnCount = rewrites
	for range rewrites {
		writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList[:40]})
		a.reconcile(dirtyConfig)
		if !a.ready.Load() {
			t.Errorf("not ready while the primary is half-written for a moment")
		}
		writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
		a.reconcile(dirtyConfig)
	}
	log := agentLog.String()
	for _, c := range []struct {
		msg  string
		want int
	}{
		{`msg="readiness changed"`, 1}, // the first install
		{`msg="waiting for the primary CNI config"`, 0},
	} {
		if got := strings.Count(log, c.msg); got != c.want {
			t.Errorf("%d rewrites in place: %d lines %s, want %d", rewrites, got, c.msg, c.want)
		}
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", log)
	}
}

// TestOnlyAPrimaryThatDropsTheEntryAtOnceMakesTheAgentNotReady: a primary that
// rewrites its config on a schedule of its own (here each rewrite 2 s after the
// entry's re-insert) leaves the entry in place nearly all the time: it is warned
// about and the agent stays ready. One that drops the entry within a second of its
// re-insert, more than REVERT_WARN_COUNT times in the window, makes it not ready.
func TestOnlyAPrimaryThatDropsTheEntryAtOnceMakesTheAgentNotReady(t *testing.T) {
	a := configAgent(t)
	a.s.RevertWarnCount = 2
	writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
	a.reconcile(dirtyConfig)
	rewrite := func(sinceWrite time.Duration) {
		t.Helper()
		a.cfg.lastWrite = time.Now().Add(-sinceWrite)
		writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
		a.reconcile(dirtyConfig)
	}
	for range 5 {
		rewrite(2 * time.Second)
	}
	if !a.ready.Load() {
		t.Fatalf("not ready after 5 rewrites each 2 s after the re-insert: %s", *a.whyNotReady.Load())
	}
	for range 3 {
		rewrite(0)
	}
	if a.ready.Load() {
		t.Fatal("ready after 3 rewrites each at once after the re-insert, REVERT_WARN_COUNT=2")
	}
	if why := *a.whyNotReady.Load(); !strings.Contains(why, "as soon as it is put back (3 times") {
		t.Errorf("not ready for %q, want the primary's 3 quick rewrites named", why)
	}
}

// TestARewriteOfTheLinkedConfigBeforeItsWatchStartsIsSeen: the config holding our
// entry links to a file in a subdirectory of the conf dir, which the conf dir's
// watch does not see. The loop watches that file's directory once the reconcile
// has found the link; a primary that rewrote the file in between (without our
// entry) made no event the watch could see. Before, the entry stayed out until
// the conf dir's next change (CI saw it: the process test's first rewrite, right
// after the agent was ready, not put back in 5 s); now the loop looks at the
// config again once it has added the watch.
func TestARewriteOfTheLinkedConfigBeforeItsWatchStartsIsSeen(t *testing.T) {
	a := configAgent(t)
	dir := a.s.MountedNetDir
	target := filepath.Join(dir, "calico", "calico.conflist")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, target, []byte(calicoConflist), 0o644)
	link := filepath.Join(dir, "10-calico.conflist")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	a.reconcile(dirtyConfig)
	if !hasEntryLast(link) || !a.ready.Load() {
		t.Fatalf("after the install: entry last %v, ready %v", hasEntryLast(link), a.ready.Load())
	}
	// The primary rewrites its file before the loop watches its directory.
	writeLikeACNI(t, target, []byte(calicoConflist))

	fw, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	if err := fw.Add(dir); err != nil {
		t.Fatal(err)
	}
	w := &watcher{Watcher: fw, dirs: map[string][]watchedDir{dir: {a.watchedDirs()[0]}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.loop(ctx, w); close(done) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); !hasEntryLast(link); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the entry is not back in %s 5 s after the loop started: %v", target, pluginTypes(t, link))
		}
	}
	// And a rewrite after the watch started is seen as before.
	writeLikeACNI(t, target, []byte(calicoConflist))
	for deadline := time.Now().Add(5 * time.Second); !hasEntryLast(link); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a rewrite after the watch started: the entry is not back in %s in 5 s: %v", target, pluginTypes(t, link))
		}
	}
}
