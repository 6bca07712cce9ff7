package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/unixsock"
)

// TestAnAgentWithoutPodCacheRemovesAKilledAgentsPodFiles: a killed agent that kept
// the pod cache leaves its pod files, which the plugin reads before anything else.
// The next agent, keeping no pod cache, removes them before it reports ready, so
// that no file that nothing refreshes decides for a pod.
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
// node memory); the next agent removes those of the kubeconfig and the TLS
// session, and the directory of a socket being made, once StaleTempAge old, and
// nothing else there.
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
	old := time.Now().Add(-StaleTempAge - time.Second)
	for _, f := range temps {
		if err := os.Chtimes(f, old, old); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(n.runDir, ".someone-else.tmp-1")
	writeFile(t, other, []byte("kept"), 0o600)
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
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
// (the pod cache's socket, which this agent's own start makes beside the cleanup;
// an earlier agent's, still running during a rolling update; a plugin's TLS
// session) is no killed writer's. The start leaves every temporary younger than
// StaleTempAge: removing one fails its writer's rename. (CI saw the pod cache's
// socket directory removed under it, and the cache down until its restart.)
func TestAnAgentsStartKeepsALiveWritersTemporaries(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	if err := os.MkdirAll(n.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	live := []string{
		filepath.Join(n.runDir, "."+plugin.KubeconfigName+".tmp-123456"),
		filepath.Join(n.runDir, "."+plugin.TLSSessionName+".tmp-654321"),
		filepath.Join(n.binDir, ".istio-cni"+tempInfix+"42"),
		filepath.Join(n.confDir, ".10-calico.conflist.tmp-42"),
	}
	for _, f := range live {
		writeFile(t, f, []byte("being written"), 0o600)
	}
	sockDir := filepath.Join(n.runDir, unixsock.TempDirPrefix+"777")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
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
}
