package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// TestAgentAndIstiosInstallerStopRewritingEachOthersBinary runs this agent while
// another installer keeps its own, different istio-cni binary in the bin dir, as
// Istio's install-cni does during a migration (this chart installed while Istio's
// DaemonSet still runs): Istio's copies its binary again on every change it sees to
// it, and two releases of this chart with different images do the same to each
// other. Each rewrites what the other wrote; without a bound they do so as fast as
// the watch reports it, an fsync of a whole binary each time. The agent must slow
// to a bounded rate, say why, and stay ready: either binary runs the entry.
func TestAgentAndIstiosInstallerStopRewritingEachOthersBinary(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t)
	p.waitReady(t)

	target := filepath.Join(n.binDir, "istio-cni")
	theirs := []byte("#!/bin/sh\n# another installer's istio-cni\nexit 0\n")
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(n.binDir); err != nil {
		t.Fatal(err)
	}
	// The other installer: whenever the binary changes and is not its own, it copies
	// its own over it (temporary file and rename).
	putTheirs := func() {
		tmp := target + ".tmp.other"
		writeFile(t, tmp, theirs, 0o755)
		if err := os.Rename(tmp, target); err != nil {
			t.Error(err)
		}
	}
	putTheirs()
	theirWrites, ourWrites := 1, 0
	for end := time.After(3 * time.Second); ; {
		select {
		case ev := <-w.Events:
			if ev.Name != target || !ev.Has(fsnotify.Create) {
				continue
			}
			if b, err := os.ReadFile(target); err == nil && string(b) != string(theirs) {
				ourWrites++
				putTheirs()
				theirWrites++
			}
			continue
		case err := <-w.Errors:
			t.Fatal(err)
		case <-end:
		}
		break
	}
	t.Logf("in 3 s: the agent wrote its binary %d times, the other installer %d", ourWrites, theirWrites)
	if ourWrites > 10 {
		t.Errorf("the agent put its binary back %d times in 3 s over another installer's, want at most 10", ourWrites)
	}
	p.waitLog(t, "the agent names the fight", `another writer keeps changing [^"]*istio-cni`)
	if p.metric(t, "istio_cni_contested_writes_deferred_total") == 0 {
		t.Error("istio_cni_contested_writes_deferred_total is 0")
	}
	if !p.ready() {
		t.Error("the agent is not ready while another installer's binary is in place")
	}
	p.stop(t)
}
