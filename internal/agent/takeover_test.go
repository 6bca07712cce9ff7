package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/unixsock"
	"github.com/istio-cni/istio-cni/test/harness/silent"
)

// istioConflist is the primary's chain with the entry Istio's own installer (sidecar
// mode, 1.2x) puts last.
const istioConflist = `{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "datastore_type": "kubernetes", "ipam": {"type": "calico-ipam"}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}},
    {
      "cniVersion": "0.3.1",
      "name": "istio-cni",
      "type": "istio-cni",
      "plugin_log_level": "info",
      "cni_agent_run_dir": "/var/run/istio-cni",
      "ambient_enabled": false,
      "enablement_selectors": [{"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
      "exclude_namespaces": ["kube-system"],
      "pod_namespace": "istio-system",
      "native_nftables": false
    }
  ]
}
`

// TestAgentTakesOverANodeFromIstiosInstallerWithoutAWindow: a node where Istio's
// istio-cni is installed (its entry last in the chain, its binary, its kubeconfig at
// the same path). The agent replaces each in place; a reader looking all along (as
// a runtime would on every pod start) never finds the chain without an istio-cni
// entry, the binary missing or partial, or the kubeconfig missing.
func TestAgentTakesOverANodeFromIstiosInstallerWithoutAWindow(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	conf := filepath.Join(n.confDir, "10-calico.conflist")
	writeFile(t, conf, []byte(istioConflist), 0o644)
	plugin := filepath.Join(n.binDir, "istio-cni")
	istioBinary := []byte("#!/bin/sh\n# Istio's istio-cni, as its installer copied it\nexit 0\n")
	writeFile(t, plugin, istioBinary, 0o755)
	if err := os.MkdirAll(n.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(n.runDir, "istio-cni-kubeconfig")
	writeFile(t, kubeconfig, []byte("# Istio's kubeconfig\n"), 0o600)
	ours, err := os.ReadFile(filepath.Join(built.source, "istio-cni"))
	if err != nil {
		t.Fatal(err)
	}

	var reads, gaps atomic.Int64
	var firstGap atomic.Value
	gap := func(format string, args ...any) {
		gaps.Add(1)
		firstGap.CompareAndSwap(nil, fmt.Sprintf(format, args...))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			reads.Add(1)
			data, err := os.ReadFile(conf)
			if err != nil {
				gap("conflist: %v", err)
			} else if types, err := typesOf(data, conf); err != nil {
				gap("conflist: %v", err)
			} else if countType(types, "istio-cni") != 1 || types[len(types)-1] != "istio-cni" {
				gap("chain %v", types)
			}
			if b, err := os.ReadFile(plugin); err != nil {
				gap("binary: %v", err)
			} else if !bytes.Equal(b, istioBinary) && !bytes.Equal(b, ours) {
				gap("binary: %d bytes, neither Istio's nor ours", len(b))
			}
			if _, err := os.Stat(kubeconfig); err != nil {
				gap("kubeconfig: %v", err)
			}
		}
	}()

	p := n.startAgent(t)
	p.waitReady(t)
	time.Sleep(100 * time.Millisecond)
	close(stop)
	<-done
	t.Logf("%d reads of the chain, binary and kubeconfig during the takeover", reads.Load())
	if gaps.Load() > 0 {
		t.Errorf("%d of %d reads found a window, first: %v", gaps.Load(), reads.Load(), firstGap.Load())
	}

	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	data, _ := os.ReadFile(conf)
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	last := list.Plugins[len(list.Plugins)-1]
	if _, ok := last["config_schema"]; !ok || last["ambient_enabled"] != nil {
		t.Errorf("the entry is not ours after the takeover: %v", last)
	}
	if len(list.Plugins) != 3 || list.Plugins[0]["type"] != "calico" || list.Plugins[1]["type"] != "portmap" {
		t.Errorf("the primary's plugins changed: %s", data)
	}
	if b, _ := os.ReadFile(plugin); !bytes.Equal(b, ours) {
		t.Errorf("the binary is not ours after the takeover")
	}
	if b, _ := os.ReadFile(kubeconfig); !strings.Contains(string(b), "token-1") {
		t.Errorf("the kubeconfig is not ours after the takeover:\n%s", b)
	}
	p.stop(t)
}

// TestAgentWhoseStartFailsLeavesTheRunningAgentsLogSockets: a rolling update of the
// chart's DaemonSet (host network, fixed ports) starts the new agent while the old
// one, terminating, still holds the monitoring and probe ports. The new one's start
// fails ("address already in use") and it exits, for the kubelet to restart it; the
// old one, still running, keeps its plugin log sockets, to which plugin runs in the
// meantime log.
func TestAgentWhoseStartFailsLeavesTheRunningAgentsLogSockets(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	old := n.startAgent(t)
	old.waitReady(t)
	port := regexp.MustCompile(`:(\d+)$`)
	metricsPort := port.FindStringSubmatch(old.metrics)[1]
	probePort := port.FindStringSubmatch(old.probe)[1]

	sockets := []string{plugin.LogSocketName, plugin.DatagramLogSocketName, plugin.IstioLogSocketName}
	before := map[string]os.FileInfo{}
	for _, s := range sockets {
		fi, err := os.Lstat(filepath.Join(n.runDir, s))
		if err != nil {
			t.Fatal(err)
		}
		before[s] = fi
	}

	cmd := exec.Command(built.agentBin)
	cmd.Env = n.env("MONITORING_PORT="+metricsPort, "READINESS_PORT="+probePort)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the second agent started on the first one's ports:\n%s", out)
	}
	if !bytes.Contains(out, []byte("address already in use")) {
		t.Errorf("the second agent failed, but not for the ports:\n%s", out)
	}

	for _, s := range sockets {
		fi, err := os.Lstat(filepath.Join(n.runDir, s))
		if err != nil || !os.SameFile(fi, before[s]) {
			t.Errorf("the running agent's %s is gone or replaced after the new agent's failed start (%v)", s, err)
		}
	}
	if c, err := net.Dial("unixpacket", filepath.Join(n.runDir, plugin.LogSocketName)); err != nil {
		t.Errorf("a plugin cannot reach the running agent's log socket: %v", err)
	} else {
		c.Close()
	}
	old.stop(t)
}

// TestAgentWhoseStartFailsLeavesTheRunningAgentsPodCache: a new agent whose start
// fails at its log sockets (here a directory in the way of log.sock) exits for the
// kubelet to restart it, and must leave the running agent's pod cache as it found
// it: its features are not started before the log sockets are taken over. They
// were, and the pod cache's first run took pods.sock and emptied the pod files'
// directory, then removed both on the way out: the running agent kept serving on a
// socket no plugin could reach, its metric saying synced.
func TestAgentWhoseStartFailsLeavesTheRunningAgentsPodCache(t *testing.T) {
	t.Parallel()
	_, port, _ := net.SplitHostPort(silent.Listen(t, "tcp", "127.0.0.1:0").Addr.String())
	n := newNode(t)
	n.writeCalico(t)
	// The running agent's pod cache (this test process plays it): its socket and a
	// pod's file.
	if err := os.MkdirAll(filepath.Join(n.runDir, kube.AgentPodFilesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(n.runDir, plugin.PodCacheSocketName)
	l, err := unixsock.Listen("unix", sock, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	podFile, _ := kube.AgentPodFile(filepath.Join(n.runDir, kube.AgentPodFilesDir), "default", "web-0")
	writeFile(t, podFile, []byte(`{"metadata":{"name":"web-0","namespace":"default","uid":"u-1"}}`), 0o600)
	if err := os.Mkdir(filepath.Join(n.runDir, plugin.IstioLogSocketName), 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(built.agentBin)
	cmd.Env = n.env("KUBERNETES_SERVICE_PORT="+port, "NODE_NAME=node-a", "POD_CACHE_ENABLED=true")
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("in the way")) {
		t.Fatalf("the new agent's start: %v, want it to fail for log.sock:\n%s", err, out)
	}
	if after, err := os.Lstat(sock); err != nil || !os.SameFile(after, before) {
		t.Errorf("the running agent's pods.sock is gone or replaced after the new agent's failed start (%v):\n%s", err, out)
	}
	if _, err := os.Stat(podFile); err != nil {
		t.Errorf("the running agent's pod file is gone after the new agent's failed start: %v", err)
	}
}
