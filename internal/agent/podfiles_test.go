package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// podFilesNode is a node whose agent keeps the pod cache, as the chart runs it, against
// a real kube-apiserver, with one meshed pod apps/web on it whose
// traffic.sidecar.istio.io/excludeInboundPorts is 8081.
type podFilesNode struct {
	cp    *controlplane.ControlPlane
	n     *node
	agent *agentProc
	pod   *corev1.Pod
	dir   string // the pod files'
	conf  *libcni.NetworkConfig
	adds  int
}

const excludeInbound = "traffic.sidecar.istio.io/excludeInboundPorts"

func startPodFilesNode(t *testing.T, ctx context.Context) *podFilesNode {
	t.Helper()
	cp := controlplane.StartForTest(t, controlplane.Options{})
	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	n, apiEnv := newNodeAs(t, ctx, cp, chartRepairRules)
	p := n.startAgent(t, append(apiEnv,
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system", "NODE_NAME=node-a",
		"PLUGIN_LOG_LEVEL=debug", "POD_CACHE_ENABLED=true")...)
	p.waitReady(t)
	web := meshPod("web", "node-a")
	web.Annotations[excludeInbound] = "8081"
	web, err := cp.AdminClient().CoreV1().Pods("apps").Create(ctx, web, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := &podFilesNode{cp: cp, n: n, agent: p, pod: web, dir: filepath.Join(n.runDir, kube.AgentPodFilesDir)}
	eventually(t, 20*time.Second, "the agent keeps a file of apps/web", func() bool {
		_, err := kube.ReadAgentPodFile(f.dir, "apps", "web")
		return err == nil
	})
	if f.conf, err = libcni.ConfFromFile(filepath.Join(n.confDir, DefaultStandaloneName)); err != nil {
		t.Fatal(err)
	}
	return f
}

// add runs the installed plugin's ADD of a new sandbox of apps/web, as the runtime
// does, and returns the iptables rules it programmed there.
func (f *podFilesNode) add(t *testing.T, ctx context.Context) string {
	t.Helper()
	f.adds++
	sandbox := newNetns(t)
	if err := netns.Do(sandbox, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP("198.51.100.30"))})
	}); err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{
		ContainerID: fmt.Sprintf("feedfacecafe%04d", f.adds), NetNS: sandbox, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_UID", string(f.pod.UID)}},
	}
	if _, err := libcni.NewCNIConfigWithCacheDir([]string{f.n.binDir}, t.TempDir(), nil).AddNetwork(ctx, f.conf, rt); err != nil {
		t.Fatalf("ADD %d: %v", f.adds, err)
	}
	var rules []byte
	if err := netns.Do(sandbox, func() error {
		var err error
		rules, err = exec.Command("iptables-save").CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("iptables-save in the sandbox: %v: %s", err, rules)
	}
	return string(rules)
}

// setExcludeInbound changes apps/web's annotation in the API server.
func (f *podFilesNode) setExcludeInbound(t *testing.T, ctx context.Context, ports string) {
	t.Helper()
	pods := f.cp.AdminClient().CoreV1().Pods("apps")
	web, err := pods.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web.Annotations[excludeInbound] = ports
	if _, err := pods.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// excludes reports whether rules let inbound traffic to port past the sidecar.
func excludes(rules, port string) bool {
	return strings.Contains(rules, "-A ISTIO_INBOUND -p tcp -m tcp --dport "+port+" -j RETURN")
}

// TestThePluginReadsNoPodFileOfAKilledAgent: an agent killed with SIGKILL (the OOM
// killer, its pod deleted without a grace period) leaves its pod files on disk,
// and nothing rewrites them when a pod changes. The plugin's next ADD of a pod
// whose excludeInboundPorts changed since must not take the file, which has the
// same pod uid, for the pod as it is: it reads the API server and programs the
// new value.
func TestThePluginReadsNoPodFileOfAKilledAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	f := startPodFilesNode(t, ctx)
	if rules := f.add(t, ctx); !excludes(rules, "8081") {
		t.Fatalf("the first ADD did not exclude inbound port 8081:\n%s", rules)
	}
	eventually(t, 10*time.Second, "the plugin reports the pod came from the agent's files", func() bool {
		return strings.Contains(f.agent.stdout.String(), "pod found in the agent's files")
	})

	f.agent.kill() // SIGKILL: nothing of its exit runs
	stale, _ := kube.AgentPodFile(f.dir, "apps", "web")
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("the killed agent's file of apps/web: %v, want it left on disk", err)
	}
	f.setExcludeInbound(t, ctx, "8082")
	rules := f.add(t, ctx)
	if !excludes(rules, "8082") || excludes(rules, "8081") {
		t.Errorf("the ADD after the agent was killed and the annotation changed to 8082 programmed (want 8082 excluded, not 8081):\n%s", rules)
	}
	// The plugin says why it did not read the file: its log file (the agent's log
	// socket is gone with it).
	logFile := filepath.Join(f.n.runDir, plugin.LogFileName)
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), kube.ErrPodFilesNotKept.Error()) {
		t.Errorf("the plugin's log %s does not say that no agent keeps the pod files:\n%s", logFile, data)
	}
	if _, err := kube.ReadAgentPodFile(f.dir, "apps", "web"); !errors.Is(err, kube.ErrPodFilesNotKept) {
		t.Errorf("ReadAgentPodFile of the killed agent's files: %v, want %v", err, kube.ErrPodFilesNotKept)
	}
}

// TestThePluginReadsNoPodFileOfAnotherFormatVersion: a pod file of a format version
// this plugin does not read (an agent of another build writing into the directory
// during an upgrade; here the running agent's file rewritten with version 99 and
// another value) is not read: the plugin logs the version it saw at debug and
// looks the pod up as for a missing file (the agent's socket here), programming
// the pod as it is.
func TestThePluginReadsNoPodFileOfAnotherFormatVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	f := startPodFilesNode(t, ctx)
	path, _ := kube.AgentPodFile(f.dir, "apps", "web")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(string(data), `{"podFileVersion":1,`, `{"podFileVersion":99,`, 1)
	other = strings.Replace(other, `"`+excludeInbound+`":"8081"`, `"`+excludeInbound+`":"9099"`, 1)
	if !strings.Contains(other, `"podFileVersion":99,`) || !strings.Contains(other, "9099") {
		t.Fatalf("the agent's file is not as expected:\n%s", data)
	}
	tmp := filepath.Join(f.dir, ".tmp-test")
	if err := os.WriteFile(tmp, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	rules := f.add(t, ctx)
	if !excludes(rules, "8081") || excludes(rules, "9099") {
		t.Errorf("the ADD with a pod file of format version 99 programmed (want the pod's 8081 excluded, not the file's 9099):\n%s", rules)
	}
	eventually(t, 10*time.Second, "the plugin logs the version it does not read and reads the agent's socket", func() bool {
		out := f.agent.stdout.String()
		return strings.Contains(out, `format version \"99\", this plugin reads 1`) && strings.Contains(out, "pod found in the agent's cache")
	})
}
