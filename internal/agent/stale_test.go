package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/unixsock"
)

// TestAnAgentWithoutPodCacheRemovesAKilledAgentsPodFiles: a killed agent that kept
// the pod cache leaves its pod files (no plugin reads them: their lock died with
// it, kube.AgentPodFilesLock), in the run dir's tmpfs, the node's memory. The next
// agent, keeping no pod cache, removes them before it reports ready, as the next
// agent that keeps one empties the directory.
func TestAnAgentWithoutPodCacheRemovesAKilledAgentsPodFiles(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	dir := filepath.Join(n.runDir, kube.AgentPodFilesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stale, _ := kube.AgentPodFile(dir, "app", "web-0")
	writeFile(t, stale, []byte(`{"metadata":{"name":"web-0","namespace":"app","uid":"u-1"},"spec":{"containers":[{"name":"app"}]}}`), 0o600)

	p := n.startAgent(t) // the harness's agent runs with POD_CACHE_ENABLED=false
	p.waitReady(t)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the agent is ready and the killed agent's pod files are still in %s (%v)", dir, err)
	}
	p.stop(t)
}

// TestTheNextAgentRemovesHalfWrittenRunDirFiles: a writer killed between its
// temporary file and the rename leaves ".NAME.tmp-*" in the run directory (tmpfs:
// node memory), and in the bin and config dirs; the next agent removes those of
// the kubeconfig, the TLS session, the binaries and the configs, and the directory
// of a socket being made, and nothing else there.
func TestTheNextAgentRemovesHalfWrittenRunDirFiles(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	if err := os.MkdirAll(n.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	temps := []string{
		filepath.Join(n.runDir, "."+plugin.KubeconfigName+".tmp-123456"),
		filepath.Join(n.runDir, "."+plugin.TLSSessionName+".tmp-654321"),
		filepath.Join(n.binDir, ".istio-cni"+tempInfix+"42"),
		filepath.Join(n.confDir, ".10-calico.conflist.tmp-42"),
	}
	for _, f := range temps {
		writeFile(t, f, []byte("half"), 0o600)
	}
	// A socket being made when its agent was killed (unixsock).
	sockDir := filepath.Join(n.runDir, unixsock.TempDirPrefix+"123456")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(sockDir, "s"), nil, 0o600)
	temps = append(temps, sockDir)
	other := filepath.Join(n.runDir, ".someone-else.tmp-1")
	writeFile(t, other, []byte("kept"), 0o600)
	p := n.startAgent(t)
	p.waitReady(t)
	for _, f := range temps {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("the agent is ready and %s is still there (%v)", f, err)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file not the agent's was removed: %v", err)
	}
	p.stop(t)
}

// TestAnAgentsStartKeepsALiveWritersTemporaries: what a live writer is making
// (an earlier agent's file or socket during a rolling update, a plugin's TLS
// session, this agent's own pod cache socket) is no killed writer's: the start
// leaves every temporary a live process holds (livetemp), and removes it once that
// process is gone. CI saw the start remove the pod cache's socket directory under
// it, and the cache down until its restart.
func TestAnAgentsStartKeepsALiveWritersTemporaries(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	if err := os.MkdirAll(n.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// This test process is the live writer: it holds each as a writer does.
	var live []string
	var held []func()
	for _, c := range []struct{ dir, pattern string }{
		{n.runDir, "." + plugin.KubeconfigName + ".tmp-*"},
		{n.runDir, "." + plugin.TLSSessionName + ".tmp-*"},
		{n.binDir, ".istio-cni" + tempInfix + "*"},
		{n.confDir, ".10-calico.conflist.tmp-*"},
		{filepath.Join(n.runDir, plugin.XtablesDirName), iptables.VersionTempPrefix + "*"}, // the plugin's
	} {
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		f, release, err := livetemp.CreateTemp(c.dir, c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		f.Close() // a writer closes before its rename, and holds the lock past it
		held = append(held, release)
		live = append(live, f.Name())
	}
	sockDir, release, err := livetemp.MkdirTemp(n.runDir, unixsock.TempDirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	live = append(live, sockDir)

	p := n.startAgent(t)
	p.waitReady(t)
	for _, f := range live {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the agent's start removed %s, a live writer's: %v", f, err)
		}
	}
	p.stop(t)

	// The writer is gone (its locks with it): the next start removes them.
	release()
	for _, release := range held {
		release()
	}
	p = n.startAgent(t)
	p.waitReady(t)
	for _, f := range live {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("the writer is gone and the next start left %s (%v)", f, err)
		}
	}
	p.stop(t)
}
