package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
