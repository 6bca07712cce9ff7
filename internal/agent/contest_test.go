package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// TestOverwritesOfAnotherWritersContentAreSpacedOut drives mayOverwrite with a
// clock: contestFree overwrites at once, then one per delay from retryMin doubling to
// retryMax; a window without an overwrite ends the contest; other files are their own.
func TestOverwritesOfAnotherWritersContentAreSpacedOut(t *testing.T) {
	a := newAgent(&Settings{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	steps := []struct {
		path string
		at   time.Time
		want bool
	}{
		// The first contestFree (5) overwrites go through at once.
		{"k", at(0), true}, {"k", at(1 * ms), true}, {"k", at(2 * ms), true}, {"k", at(3 * ms), true}, {"k", at(4 * ms), true},
		// The sixth too, and then a second must pass.
		{"k", at(5 * ms), true},
		{"k", at(6 * ms), false},
		{"k", at(1004 * ms), false},
		// Another file is not held back by this one.
		{"c", at(1004 * ms), true},
		{"k", at(1005 * ms), true},
		// Then two seconds, then four.
		{"k", at(3004 * ms), false},
		{"k", at(3005 * ms), true},
		{"k", at(7004 * ms), false},
		{"k", at(7005 * ms), true},
		// A contestWindow without another writer's content ends the contest.
		{"k", at(7005*ms + contestWindow), true},
		{"k", at(7006*ms + contestWindow), true},
	}
	var got, want []bool
	for _, s := range steps {
		got = append(got, a.mayOverwrite(s.path, s.at))
		want = append(want, s.want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mayOverwrite per step (-want +got):\n%s", diff)
	}
	// The delay stops doubling at retryMax, and a contest at that pace goes on.
	now := at(time.Hour)
	for range contestFree + 1 {
		now = now.Add(ms)
		a.mayOverwrite("k", now)
	}
	for range 20 {
		now = now.Add(retryMax)
		if !a.mayOverwrite("k", now) {
			t.Fatalf("an overwrite retryMax after the last was put off (delay %s)", a.contests["k"].delay)
		}
	}
	c := a.contests["k"]
	if c.delay != retryMax {
		t.Errorf("delay after 20 contested overwrites = %s, want retryMax %s", c.delay, retryMax)
	}
	if len(c.overwrites) > contestFree {
		t.Errorf("%d overwrite times kept, want at most %d", len(c.overwrites), contestFree)
	}
	// The quiet file's record was dropped.
	if _, ok := a.contests["c"]; ok {
		t.Error("the contest record of a file untouched for a window is still kept")
	}
}

// TestTheEndOfAContestIsLogged: a contest (another writer kept changing a file) is
// logged at error once; once the other writer has left the file alone for
// contestWindow, the log says so. It used to say nothing: the contest was forgotten
// only at the next overwrite of another file, silently, and this agent's own
// content in place raises no event, so the error stayed the log's last word on the
// file after the other agent had gone.
func TestTheEndOfAContestIsLogged(t *testing.T) {
	a := configAgent(t)
	var agentLog logbuf.Buffer
	a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
	const path = "/etc/cni/net.d/10-calico.conflist"
	// The other writer's content was found contestFree+1 times, last almost a
	// window ago; the reconcile that found it ends as any does.
	last := time.Now().Add(-contestWindow + 300*time.Millisecond)
	for i := range contestFree + 1 {
		a.mayOverwrite(path, last.Add(time.Duration(i-contestFree)*time.Millisecond))
	}
	if !strings.Contains(agentLog.String(), "another writer keeps changing "+path) {
		t.Fatalf("the contest is not reported:\n%s", agentLog.String())
	}
	a.reconcile(0)

	fw, err := fsnotify.NewWatcher() // watches nothing: only the agent's own wake can end it
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.loop(ctx, &watcher{Watcher: fw}); close(done) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(agentLog.String(), `msg="another writer no longer changes the file" file=`+path); {
		if time.Now().After(deadline) {
			t.Fatalf("the contest's end is not logged within 5 s of the window's end:\n%s", agentLog.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAContestedFileIsNotLoggedAtEveryPutBack: two agents that disagree (two
// releases of the chart on a node) each put their own content back once per retry,
// up to once every 30 s for as long as both run. The contest is logged once (and
// its end); each put-back was logged too ("replaced an istio-cni entry that
// differed", "restored binary", "rewrote the plugin's kubeconfig"): 120 lines an
// hour per file, on each agent. Now only those before the contest is reported.
func TestAContestedFileIsNotLoggedAtEveryPutBack(t *testing.T) {
	src := filepath.Join(t.TempDir(), "istio-cni")
	writeFile(t, src, []byte("#!/bin/sh\n# ours\n"), 0o755)
	size, sum, err := digest(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, line string
		d          dirty
		setUp      func(a *agent) (path string)
		theirs     func(t *testing.T, path string, i int)
	}{
		{"entry", `msg="replaced an istio-cni entry that differed from this agent's"`, dirtyConfig,
			func(a *agent) string {
				writeFiles(t, a.s.MountedNetDir, map[string]string{"10-calico.conflist": calicoList})
				return filepath.Join(a.s.MountedNetDir, "10-calico.conflist")
			},
			func(t *testing.T, path string, i int) {
				writeFile(t, path, fmt.Appendf(nil, `{"cniVersion":"0.3.1","name":"k8s","plugins":[{"type":"calico"},{"name":"istio-cni","type":"istio-cni","release":%d}]}`, i), 0o644)
			}},
		{"binary", `msg="restored binary"`, dirtyBinaries,
			func(a *agent) string {
				a.s.UpdateBinaries = true
				a.bins = []binary{{name: "istio-cni", src: src, size: size, sum: sum}}
				a.binDirs = []string{t.TempDir()}
				return filepath.Join(a.binDirs[0], "istio-cni")
			},
			func(t *testing.T, path string, i int) {
				writeFile(t, path, fmt.Appendf(nil, "#!/bin/sh\n# theirs %d\n", i), 0o755)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := configAgent(t)
			var agentLog logbuf.Buffer
			a.log = slog.New(slog.NewTextHandler(&agentLog, nil))
			path := tc.setUp(a)
			a.reconcile(tc.d)
			const putBacks = 20
			for i := range putBacks {
				tc.theirs(t, path, i)
				if c := a.contests[path]; c != nil {
					c.next = time.Time{} // its retry has come
				}
				a.reconcile(tc.d)
			}
			log := agentLog.String()
			if !strings.Contains(log, "another writer keeps changing "+path) {
				t.Fatalf("no contest reported:\n%s", log)
			}
			if got := strings.Count(log, tc.line); got != contestFree {
				t.Errorf("%d put-backs of %s logged %d times, want %d (those before the contest):\n%s", putBacks, path, got, contestFree, log)
			}
			if tc.d == dirtyBinaries {
				// A deleted binary put back during the contest is not a put-back over theirs.
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				a.reconcile(tc.d)
				if got := strings.Count(agentLog.String(), tc.line); got != contestFree+1 {
					t.Errorf("the restore of the deleted binary is not logged:\n%s", agentLog.String())
				}
			}
		})
	}
}
