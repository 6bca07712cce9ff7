package nodee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// Pods with hostUsers: false run in a user namespace of their own, which the
// kubelet maps (its default range, the node having no kubelet user) and
// containerd 2 makes, with the pod's network namespace inside it. Both backends
// capture them: in iptables mode (the default) the plugin runs iptables-save and
// iptables-restore in the pod's user namespace, where the kernel takes the
// proxy's owner match; with nativeNftables it writes its tables from the node's.
// A request from one such pod to another goes out through the client's proxy and
// in through the app's (the proxy's own traffic, uid 1337 in the pod, bypasses
// the capture), and the pods' DELs remove the capture without a warning.
func TestPodsWithHostUsersFalseAreCapturedByEveryBackend(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		// captured says whether the pod's rules hold the capture, owner match
		// included.
		captured func(testing.TB, *meshnode.Session, *corev1.Pod) (bool, string)
	}{
		{"iptables", nil, func(t testing.TB, s *meshnode.Session, p *corev1.Pod) (bool, string) {
			rules, err := s.ShowRules(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			return meshnode.Captured(rules) && strings.Contains(rules, "--uid-owner 1337"), rules
		}},
		{"nftables", []string{"--set", "nativeNftables=true"}, func(t testing.TB, _ *meshnode.Session, p *corev1.Pod) (bool, string) {
			ruleset := nftRuleset(t, p)
			return strings.Contains(ruleset, "15001") && strings.Contains(ruleset, "15006") && strings.Contains(ruleset, "skuid 1337"), ruleset
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := session(t)
			install(t, s, values(t, tc.values...))
			ns := "userns-" + tc.name
			since := time.Now()
			pods := createPods(t, withoutHostUsers(meshnode.MeshedPod(ns, "client")), withoutHostUsers(meshnode.MeshedPod(ns, "app")))
			client, app := pods[0], pods[1]
			for _, p := range pods {
				checkOwnUserNamespace(t, p)
				if ok, rules := tc.captured(t, s, p); !ok {
					t.Errorf("pod %s: no capture (with the proxy's owner match) in its netns:\n%s", p.Name, rules)
				}
			}
			checkRequestThroughProxies(t, s, client, app, net.JoinHostPort(app.Status.PodIP, "8080"), "127.0.0.6")
			if ok, failed := pluginADDs(t, ns, since); len(ok) != len(pods) || len(failed) != 0 {
				t.Errorf("the plugin's ADDs in %s: %d captured, %d failed %+v; want %d captured", ns, len(ok), len(failed), failed, len(pods))
			}

			// A graceful deletion: the kubelet stops the sandbox (the CNI DEL)
			// before the pod is gone from the API server, and the plugin logs the
			// DEL before it returns.
			for _, p := range pods {
				if err := theNode.Client().CoreV1().Pods(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			waitPodsGone(t, pods)
			var dels []addRecord
			for deadline := time.Now().Add(30 * time.Second); ; {
				dels = pluginDELRecords(t, ns, since)
				done := map[string]bool{}
				for _, d := range dels {
					done[d.Pod] = done[d.Pod] || d.Msg == "DEL: done"
				}
				if done[ns+"/"+client.Name] && done[ns+"/"+app.Name] {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no \"DEL: done\" for each pod in the plugin log within 30s; its DEL records of %s: %+v", ns, dels)
				}
				time.Sleep(100 * time.Millisecond)
			}
			for _, d := range dels {
				if d.Level == "WARN" || d.Level == "ERROR" {
					t.Errorf("DEL of %s: %s %s: %s", d.Pod, d.Level, d.Msg, d.Error)
				}
			}
		})
	}
}

// withoutHostUsers sets hostUsers: false: the pod gets a user namespace of its own.
func withoutHostUsers(p *corev1.Pod) *corev1.Pod {
	p.Spec.HostUsers = ptr.To(false)
	return p
}

// checkOwnUserNamespace proves the pod runs in a user namespace of its own: its
// app container's user namespace is not the node's, its uid_map is not the
// identity (the pod's root is an unprivileged uid of the node), and its network
// namespace is owned by that user namespace, which is what the plugin acts on.
func checkOwnUserNamespace(t testing.TB, p *corev1.Pod) {
	t.Helper()
	pid, err := meshnode.PID(context.Background(), theNode, p, "app")
	if err != nil {
		t.Fatal(err)
	}
	var own, pods unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &own); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &pods); err != nil {
		t.Fatal(err)
	}
	if own.Ino == pods.Ino && own.Dev == pods.Dev {
		t.Errorf("pod %s: its app container (pid %d) runs in the node's user namespace", p.Name, pid)
	}
	uidMap, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	var inside, outside, length uint64
	if _, err := fmt.Sscan(string(uidMap), &inside, &outside, &length); err != nil {
		t.Fatalf("pod %s: uid_map %q: %v", p.Name, uidMap, err)
	}
	if inside != 0 || outside == 0 || length > 1<<16 {
		t.Errorf("pod %s: uid_map %q, want the pod's 0 mapped to an unprivileged range of the node (at most 65536 ids)", p.Name, uidMap)
	}
	owner, err := netns.ForeignOwner(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	if owner < 0 {
		t.Errorf("pod %s: its network namespace is owned by the node's user namespace, want the pod's", p.Name)
		return
	}
	defer unix.Close(owner)
	var netOwner unix.Stat_t
	if err := unix.Fstat(owner, &netOwner); err != nil {
		t.Fatal(err)
	}
	if netOwner.Ino != pods.Ino || netOwner.Dev != pods.Dev {
		t.Errorf("pod %s: its network namespace's owner is not its containers' user namespace", p.Name)
	}
	t.Logf("pod %s: app pid %d, uid_map %s", p.Name, pid, strings.Join(strings.Fields(string(uidMap)), " "))
}

// pluginDELRecords are the plugin's records of DELs of pods in namespace written
// at or after since, at every level.
func pluginDELRecords(tb testing.TB, namespace string, since time.Time) []addRecord {
	tb.Helper()
	var out []addRecord
	for _, line := range strings.Split(string(pluginLog(tb)), "\n") {
		var rec struct {
			addRecord
			Command string `json:"command"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Command != "DEL" || !strings.HasPrefix(rec.Pod, namespace+"/") || rec.Time.Before(since) {
			continue
		}
		out = append(out, rec.addRecord)
	}
	return out
}
