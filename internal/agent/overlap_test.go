package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
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

// TestUninstallLeavesAKubeconfigAnotherWriterPutThere: an agent that exits with
// uninstall while another installer's kubeconfig is in place (Istio's install-cni
// beside it during a migration back, writing the same path) leaves that file, as it
// leaves another's binary: removing it would leave the other plugin without a
// kubeconfig until its installer noticed. The agent's own kubeconfig is still
// removed (the other tests' "node as before" checks).
func TestUninstallLeavesAKubeconfigAnotherWriterPutThere(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t)
	p.waitReady(t)

	path := filepath.Join(n.runDir, plugin.KubeconfigName)
	theirs := []byte("apiVersion: v1\nkind: Config\n# another installer's kubeconfig\n")
	// The agent puts its own back the first few times; once it defers, the other's
	// content stays in place.
	p.contestUntilDeferred(t, path, string(theirs), 0o600)
	p.stop(t)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the other writer's kubeconfig is gone after the agent's uninstall: %v", err)
	}
	if string(got) != string(theirs) {
		t.Errorf("kubeconfig after the agent's uninstall:\n%s\nwant the other writer's:\n%s", got, theirs)
	}
	p.waitLog(t, "the agent says why it left the file", `kubeconfig left in place: it holds another writer's content`)
}

// TestTheRemainingAgentServesItsSocketsAgainWhenAnOverlappingAgentLeaves: two agents
// on one node (a canary DaemonSet beside the main one, or Istio's and this one during
// a migration) share the run dir. The one that starts later takes over the plugin's
// log sockets and pods.sock by replacing them; when it then stops (its DaemonSet
// removed) it removes them, as they are its own. The agent still running kept
// listening on sockets no plugin can reach: the plugin's records no longer reached
// its stdout nor its metrics, every ADD asked the API server, and
// istio_cni_pod_cache_synced went on saying 1. It must make them again.
func TestTheRemainingAgentServesItsSocketsAgainWhenAnOverlappingAgentLeaves(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Pods("apps").Create(ctx, appPod("web", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, apiEnv := newNodeAs(t, ctx, cp, chartRepairRules)
	n.writeCalico(t)
	env := append(apiEnv, "POD_NAMESPACE=istio-system", "NODE_NAME=node-a", "POD_CACHE_ENABLED=true")
	podsSock := filepath.Join(n.runDir, plugin.PodCacheSocketName)
	agentClient := kube.NewAgentClient(podsSock, time.Second)
	cacheAnswers := func() bool {
		_, err := agentClient.GetPod(ctx, "apps", "web", "", 0)
		return err == nil
	}

	staying := n.startAgent(t, env...)
	staying.waitReady(t)
	eventually(t, 20*time.Second, "the first agent's pods.sock answers", cacheAnswers)
	leaving := n.startAgent(t, env...)
	leaving.waitReady(t)
	leaving.waitLog(t, "the second agent's pod cache serves", `pod cache synced`)
	leaving.stop(t) // the harness's agents uninstall on exit: its DaemonSet is gone

	eventually(t, 20*time.Second, "the staying agent is ready again", staying.ready)
	for _, s := range []string{plugin.LogSocketName, plugin.DatagramLogSocketName, plugin.IstioLogSocketName, plugin.PodCacheSocketName} {
		path := filepath.Join(n.runDir, s)
		eventually(t, 20*time.Second, s+" is there again for the staying agent", func() bool {
			fi, err := os.Lstat(path)
			return err == nil && fi.Mode().Type() == os.ModeSocket
		})
	}
	c, err := net.Dial("unixpacket", filepath.Join(n.runDir, plugin.LogSocketName))
	if err != nil {
		t.Fatalf("a plugin cannot reach the staying agent's log socket: %v", err)
	}
	if _, err := c.Write([]byte(`{"level":"INFO","msg":"ADD: reaches the staying agent"}`)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	eventually(t, 10*time.Second, "the plugin's record reaches the staying agent's stdout", func() bool {
		return strings.Contains(staying.stdout.String(), "ADD: reaches the staying agent")
	})
	eventually(t, 20*time.Second, "the staying agent's pods.sock answers for apps/web", cacheAnswers)
	if v := staying.metric(t, "istio_cni_pod_cache_synced"); v != 1 {
		t.Errorf("istio_cni_pod_cache_synced = %v once the socket answers, want 1", v)
	}
	file, _ := kube.AgentPodFile(filepath.Join(n.runDir, kube.AgentPodFilesDir), "apps", "web")
	eventually(t, 20*time.Second, "the staying agent's pod file for apps/web", func() bool {
		_, err := os.Stat(file)
		return err == nil
	})
	staying.stop(t)
}

// TestUninstallLeavesAnEntryAnotherWriterPutThere: an agent that exits with
// uninstall while another installer's istio-cni entry is in place (Istio's
// install-cni beside it, or a second agent whose settings differ: each puts its own
// entry back until this one defers) leaves that entry, as it leaves another's
// kubeconfig and binary: taken out, pods would start unredirected until the other
// installer put it back. Chained, the other's entry stays in the primary's chain;
// standalone, the other's file of our type stays. The agent's own entry is still
// taken out (the other tests' "node as before" checks).
func TestUninstallLeavesAnEntryAnotherWriterPutThere(t *testing.T) {
	istiosEntry := `{"type": "istio-cni", "plugin_log_level": "info", "cni_agent_run_dir": "/var/run/istio-cni", "ambient_enabled": false, ` +
		`"kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig", "cni_bin_dir": "/opt/cni/bin", "exclude_namespaces": ["kube-system"]}}`
	cases := []struct {
		name    string
		chained bool
		file    string
		theirs  string
	}{
		{"chained", true, "10-calico.conflist", strings.Replace(calicoConflist, "\n  ]", ",\n    "+istiosEntry+"\n  ]", 1)},
		{"standalone", false, DefaultStandaloneName, `{"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni", "plugin_log_level": "debug"}` + "\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.writeCalico(t)
			p := n.startAgent(t, "CHAINED_CNI_PLUGIN="+strconv.FormatBool(tc.chained))
			p.waitReady(t)

			path := filepath.Join(n.confDir, tc.file)
			// The agent puts its own back the first few times; once it defers, the
			// other's content stays in place.
			p.contestUntilDeferred(t, path, tc.theirs, 0o644)
			p.stop(t)
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("the other writer's config is gone after the agent's uninstall: %v", err)
			}
			if string(got) != tc.theirs {
				t.Errorf("%s after the agent's uninstall:\n%s\nwant the other writer's:\n%s", tc.file, got, tc.theirs)
			}
			p.waitLog(t, "the agent says why it left the entry", `istio-cni entry left in place: it holds another writer's content`)
		})
	}
}
