package nodee2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/test/harness/node"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// networkReadyBound bounds how long containerd and the kubelet take to see a change
// of the plugin's STATUS: containerd runs STATUS at every CRI Status call, which the
// kubelet makes every few seconds, and the node status goes out every 4 s here.
const networkReadyBound = 60 * time.Second

// TestContainerdReportsThePluginsStatusAsTheNodesNetworkReadiness: containerd 2.x
// runs the STATUS of every plugin of a CNI 1.1.0 config list (the node's primary is
// one) at each CRI Status call, and the kubelet turns a failure into a NotReady node.
// With the chart installed the network is ready. When the plugin cannot work (its
// kubeconfig cannot be read: a directory stands where the file should be, which the
// agent cannot replace), containerd reports NetworkReady=false with the plugin's
// message and the node goes NotReady, so no pod is sent to a node where every ADD
// would fail. Once the agent can write its kubeconfig again, both come back without
// anyone touching the node.
func TestContainerdReportsThePluginsStatusAsTheNodesNetworkReadiness(t *testing.T) {
	s := session(t)
	install(t, s, values(t))
	ctx := t.Context()
	waitNetwork(ctx, t, true, "")
	waitNode(ctx, t, true, "")

	kc := filepath.Join(theNode.StateDir(), "istio-cni-run", "istio-cni-kubeconfig")
	t.Cleanup(func() {
		if fi, err := os.Stat(kc); err == nil && fi.IsDir() {
			os.Remove(kc)
		}
		waitNetwork(context.Background(), t, true, "")
		waitNode(context.Background(), t, true, "")
	})
	// The agent rewrites a removed kubeconfig at once: retry until the directory is
	// the one in place.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(kc); err == nil && fi.IsDir() {
			break
		}
		os.Remove(kc)
		if err := os.Mkdir(kc, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("could not put a directory at %s", kc)
		}
	}
	began := time.Now()
	c := waitNetwork(ctx, t, false, "istio-cni cannot look pods up")
	t.Logf("containerd: NetworkReady=false after %s: %s", time.Since(began).Round(time.Millisecond), c.Message)
	waitNode(ctx, t, false, "istio-cni cannot look pods up")
	t.Logf("node NotReady after %s", time.Since(began).Round(time.Millisecond))

	if err := os.Remove(kc); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	waitNetwork(ctx, t, true, "")
	waitNode(ctx, t, true, "")
	t.Logf("network ready and node Ready again %s after the agent could write its kubeconfig", time.Since(began).Round(time.Millisecond))
	if fi, err := os.Stat(kc); err != nil || fi.IsDir() {
		t.Errorf("the agent did not write the kubeconfig back: %v", err)
	}
}

// waitNetwork waits until containerd's NetworkReady condition is ready (with its
// message containing msg when not ready) and returns it.
func waitNetwork(ctx context.Context, t *testing.T, ready bool, msg string) node.RuntimeCondition {
	t.Helper()
	deadline := time.Now().Add(networkReadyBound)
	var last string
	for {
		conds, err := theNode.RuntimeStatus(ctx)
		if err == nil {
			c, ok := conds["NetworkReady"]
			if ok && c.Status == ready && strings.Contains(c.Message, msg) {
				return c
			}
			last = fmt.Sprintf("%+v", conds)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd's NetworkReady did not become %t (message with %q) within %s; last: %s", ready, msg, networkReadyBound, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNode waits until the Node's Ready condition is ready (its message containing
// msg when not), and, when ready, the node has no not-ready taint left.
func waitNode(ctx context.Context, t *testing.T, ready bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(networkReadyBound)
	var last string
	for {
		no, err := theNode.Client().CoreV1().Nodes().Get(ctx, theNode.Name(), metav1.GetOptions{})
		if err == nil {
			last = ""
			for _, c := range no.Status.Conditions {
				if c.Type == corev1.NodeReady {
					last = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
					if (c.Status == corev1.ConditionTrue) == ready && strings.Contains(c.Message, msg) {
						if !ready || !hasNotReadyTaint(no) {
							return
						}
						last += "; still tainted not-ready"
					}
				}
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("node Ready did not become %t (message with %q) within %s; last: %s", ready, msg, networkReadyBound, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func hasNotReadyTaint(no *corev1.Node) bool {
	for _, taint := range no.Spec.Taints {
		if taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable {
			return true
		}
	}
	return false
}

// TestGCOnTheRealNodeRemovesOnlyWhatNoLivePodUses: containerd 2.4 does not call
// CNI GC (its CNI library has no GC call), so the test calls it as a runtime
// would, through libcni, on the node's own config list (ptp, then istio-cni as the
// agent inserted it) with the live sandboxes as the valid attachments (ptp and
// host-local v1.9.1 do not implement GC yet, and pass). istio-cni keeps no state of
// an attachment outside the pod's network namespace, which dies with the pod; GC
// removes its per-namespace xtables lock files unused for an hour and nothing else:
// live meshed pods keep their address and their capture, and their traffic still
// goes through the proxy.
func TestGCOnTheRealNodeRemovesOnlyWhatNoLivePodUses(t *testing.T) {
	s := session(t)
	ctx := t.Context()
	install(t, s, values(t))
	pods := createPods(t, meshnode.MeshedPod("gc", "client"), meshnode.MeshedPod("gc", "app"))
	client, app := pods[0], pods[1]

	runDir := filepath.Join(theNode.StateDir(), "istio-cni-run")
	staleLock := filepath.Join(runDir, "xtables", "xtables-4026599999.lock")
	freshLock := filepath.Join(runDir, "xtables", "xtables-4026599998.lock")
	for _, f := range []string{staleLock, freshLock} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(staleLock, old, old); err != nil {
		t.Fatal(err)
	}
	liveIP := filepath.Join(theNode.StateDir(), "cni", "ipam", "istio-cni-node", app.Status.PodIP)
	if _, err := os.Stat(liveIP); err != nil {
		t.Fatalf("no host-local reservation for the live pod: %v", err)
	}

	conf, err := libcni.ConfListFromFile(filepath.Join(theNode.CNIConfDir(), "10-ptp.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if got := pluginTypes(conf); strings.Join(got, ",") != "ptp,istio-cni" {
		t.Fatalf("node config list is %v, want ptp then istio-cni", got)
	}
	sandboxes, err := theNode.Sandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var valid []types.GCAttachment
	for _, sb := range sandboxes {
		if sb.State == "SANDBOX_READY" {
			valid = append(valid, types.GCAttachment{ContainerID: sb.ID, IfName: "eth0"})
		}
	}
	if len(valid) < 2 {
		t.Fatalf("want the two live sandboxes among the runtime's, got %+v", sandboxes)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{theNode.CNIBinDir()}, t.TempDir(), nil)
	if err := cni.GCNetworkList(ctx, conf, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		t.Fatalf("GC: %v", err)
	}

	for _, f := range []string{staleLock} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("GC left %s (%v)", f, err)
		}
	}
	for _, f := range []string{freshLock, liveIP} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("GC removed %s, which is in use: %v", f, err)
		}
	}
	os.Remove(freshLock)
	for _, p := range []*corev1.Pod{client, app} {
		if _, rules, err := meshnode.Rules(ctx, theNode, p); err != nil || !meshnode.Captured(rules) {
			t.Errorf("pod %s lost its capture after GC: %v\n%s", p.Name, err, rules)
		}
	}
	answer, err := s.Request(ctx, client, app)
	if err != nil || !strings.Contains(answer, "hello from "+app.Name) {
		t.Errorf("request after GC: %q %v", answer, err)
	}
	if log, _ := s.ProxyLog(ctx, client); len(meshnode.Forwarded(log, "outbound")) == 0 {
		t.Errorf("after GC the client's request did not go through its proxy:\n%s", log)
	}
}

func pluginTypes(l *libcni.NetworkConfigList) []string {
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}
