package nodee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// The default chart's agent, in its container on the real node (the chart's
// securityContext: DAC_OVERRIDE alone, RuntimeDefault seccomp, read-only root;
// no /proc), sees the node's iptables tools through its read-only mounts of the
// node's /usr, /sbin and /bin (this machine's merged /usr: /sbin a link the
// runtime follows) and is ready, saying the kernel was not tried and why. The
// same DaemonSet with those three host paths pointing at a node root without
// iptables, everything else the chart's (mount paths, securityContext,
// environment), keeps its agent not ready, naming the missing tools and where
// it looked, with istio_cni_plugin_backend_unusable 1.
func TestTheDefaultChartsNodeCheckSeesTheNodesTools(t *testing.T) {
	ctx := context.Background()
	s := session(t)
	agent := install(t, s, values(t))
	logs, err := s.Kubectl(ctx, "logs", "-n", meshnode.Namespace, agent.Name, "-c", "install-cni")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`node check: nothing missing for the plugin's rule backend in what this agent can check, the rest not checked" backend=iptables-nft nodeRoot=/host nodeDirs=/usr,/sbin,/bin detected=true restore="map[ipv4:/usr/sbin/iptables-nft-restore ipv6:/usr/sbin/ip6tables-nft-restore]"`,
		"the kernel: not tried, writing a pod's rules in a throwaway network namespace takes CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW, and this agent lacks CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("agent log lacks %q:\n%s", want, logs)
		}
	}
	if got := agentMetric(t, agent, "istio_cni_plugin_backend_unusable"); got != "0" {
		t.Errorf("istio_cni_plugin_backend_unusable = %s, want 0", got)
	}

	// A node without iptables: the directories the kubelet checks (type
	// Directory), nothing of netfilter's in them.
	bare := filepath.Join(theNode.StateDir(), "node-without-iptables")
	for _, d := range []string{"usr/bin", "usr/sbin", "sbin", "bin"} {
		if err := os.MkdirAll(filepath.Join(bare, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(bare) })
	ds, err := theNode.Client().AppsV1().DaemonSets(meshnode.Namespace).Get(ctx, "istio-cni-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var patch []map[string]string
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && (v.HostPath.Path == "/usr" || v.HostPath.Path == "/sbin" || v.HostPath.Path == "/bin") {
			patch = append(patch, map[string]string{"op": "replace", "path": fmt.Sprintf("/spec/template/spec/volumes/%d/hostPath/path", i), "value": bare + v.HostPath.Path})
		}
	}
	if len(patch) != 3 {
		t.Fatalf("the default chart's DaemonSet mounts %d of the node's /usr, /sbin and /bin, want 3: %+v", len(patch), ds.Spec.Template.Spec.Volumes)
	}
	p, _ := json.Marshal(patch)
	if _, err := s.Kubectl(ctx, "patch", "daemonset", "istio-cni-node", "-n", meshnode.Namespace, "--type=json", "-p", string(p)); err != nil {
		t.Fatal(err)
	}
	var lacking *corev1.Pod
	var lackingLogs string
	waitFor(t, "the agent on the node without iptables logs the missing tools", 90*time.Second, func() bool {
		pods, err := theNode.Client().CoreV1().Pods(meshnode.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=istio-cni-node"})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			if pods.Items[i].Name == agent.Name || pods.Items[i].DeletionTimestamp != nil {
				continue
			}
			lacking = &pods.Items[i]
			lackingLogs, _ = s.Kubectl(ctx, "logs", "-n", meshnode.Namespace, lacking.Name, "-c", "install-cni")
			return strings.Contains(lackingLogs, "this node cannot run the plugin's rule backend: every meshed pod's ADD fails here")
		}
		return false
	})
	for _, want := range []string{
		"found no iptables-legacy-save and iptables-legacy-restore (or iptables-save and iptables-restore), nor ip6tables-legacy-save and ip6tables-legacy-restore",
		"in /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin of the node (its /usr, /sbin, /bin seen at /host, nothing else of it)",
		"nativeNftables",
	} {
		if !strings.Contains(lackingLogs, want) {
			t.Errorf("agent log lacks %q:\n%s", want, lackingLogs)
		}
	}
	lacking, err = theNode.Client().CoreV1().Pods(meshnode.Namespace).Get(ctx, lacking.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range lacking.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			t.Errorf("agent pod %s is Ready on a node without the plugin's tools", lacking.Name)
		}
	}
	if got := agentMetric(t, lacking, "istio_cni_plugin_backend_unusable"); got != "1" {
		t.Errorf("istio_cni_plugin_backend_unusable = %s, want 1", got)
	}
}

// agentMetric is a series' value on the agent pod's /metrics, on the node's
// loopback (the agent uses the host network and listens on every address).
func agentMetric(t *testing.T, agent *corev1.Pod, series string) string {
	t.Helper()
	var port int32
	for _, c := range agent.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				port = p.ContainerPort
			}
		}
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s on the agent's /metrics", series)
	return ""
}
