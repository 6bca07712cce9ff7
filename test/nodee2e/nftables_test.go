package nodee2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// nftRuleset is `nft list ruleset` in the pod's network namespace.
func nftRuleset(t testing.TB, p *corev1.Pod) string {
	t.Helper()
	pid, err := meshnode.PID(context.Background(), theNode, p, "app")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nsenter", "-t", fmt.Sprint(pid), "-n", "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v: %s", p.Name, err, out)
	}
	return string(out)
}

// With nativeNftables the plugin programs nftables tables of its own instead of
// iptables rules, and traffic goes through the proxy the same way.
func TestNativeNftablesModeCapturesWithNftTables(t *testing.T) {
	s := session(t)
	install(t, s, values(t, "--set", "nativeNftables=true"))
	pods := createPods(t, meshnode.MeshedPod("nft", "app"), meshnode.MeshedPod("nft", "client"))
	app, client := pods[0], pods[1]
	for _, p := range pods {
		ruleset := nftRuleset(t, p)
		if !strings.Contains(ruleset, "table ") || !strings.Contains(ruleset, "15001") || !strings.Contains(ruleset, "15006") {
			t.Errorf("pod %s: no nftables capture:\n%s", p.Name, ruleset)
		}
		rules, _ := s.ShowRules(context.Background(), p)
		if meshnode.HasIstioRules(rules) {
			t.Errorf("pod %s: iptables rules besides the nftables tables:\n%s", p.Name, rules)
		}
	}
	answer, err := s.Request(context.Background(), client, app)
	if err != nil || !strings.Contains(answer, "127.0.0.6") {
		t.Fatalf("request: %q, %v", answer, err)
	}
	dst := app.Status.PodIP + ":8080"
	clientLog, _ := s.ProxyLog(context.Background(), client)
	appLog, _ := s.ProxyLog(context.Background(), app)
	if !contains(meshnode.Forwarded(clientLog, "outbound"), dst) || !contains(meshnode.Forwarded(appLog, "inbound"), dst) {
		t.Errorf("not through both proxies:\nclient:\n%s\napp:\n%s", clientLog, appLog)
	}
}

// Repair in place runs inside the agent's container with the image's own iptables
// (in the flavour the node's plugin uses) or, with native nftables, through
// netlink: a pod started before the agent, whose validation failed, passes it on its
// next try as the same pod (same UID), with the capture in its namespace. A pod
// with hostUsers: false is repaired too: in iptables mode the image's tools run in
// the pod's user namespace, joined from the agent's container under the chart's
// capabilities and its RuntimeDefault seccomp profile.
func TestRepairInPlaceFromTheAgentImage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		values    []string
		backend   string // as the agent logs it: the node's flavour (this machine's plugin picks nft)
		rules     func(testing.TB, *corev1.Pod) string
		owner     string // the proxy's owner match, as rules shows it
		hostUsers bool
	}{
		{"iptables", nil, "iptables-nft", iptablesNat, "--uid-owner 1337", true},
		{"nftables", []string{"--set", "nativeNftables=true"}, "nftables", nftRuleset, "skuid 1337", true},
		{"iptables-hostusers-false", nil, "iptables-nft", iptablesNat, "--uid-owner 1337", false},
		{"nftables-hostusers-false", []string{"--set", "nativeNftables=true"}, "nftables", nftRuleset, "skuid 1337", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := session(t)
			ns := "inplace-" + tc.name
			var edits []func(*corev1.Pod) *corev1.Pod
			if !tc.hostUsers {
				edits = append(edits, withoutHostUsers)
			}
			deployment(t, ns, "early", 1, edits...)
			broken := waitValidationFailed(t, ns, "early")
			ensureSharedNetnsDir(t)
			agent := install(t, s, values(t, append(tc.values, "--set", "repair.repairPods=true")...))
			logs, err := s.Kubectl(context.Background(), "logs", "-n", meshnode.Namespace, agent.Name, "-c", "install-cni")
			if err != nil {
				t.Fatal(err)
			}
			// The flavour is judged from the node's own filesystem, seen through
			// the node's /proc (not the container's, which has both flavours).
			if want := "repair in place programs pods with the plugin's backend\" backend=" + tc.backend + " nodeRoot=/host/proc/"; !strings.Contains(logs, want) {
				t.Errorf("agent log lacks %q:\n%s", want, logs)
			}
			// The node check ran in the container, with the chart's capabilities:
			// the node's tools seen through its /proc, the kernel tried in a
			// throwaway namespace with the image's tools, nothing missing.
			if want := "node check: this node runs the plugin's rule backend: its tools (if any) are installed and its kernel took a pod's rules in a throwaway network namespace\" backend=" + tc.backend + " nodeRoot=/host/proc/"; !strings.Contains(logs, want) {
				t.Errorf("agent log lacks %q:\n%s", want, logs)
			}
			fixed := readyPods(t, ns, "early", 1, 120*time.Second)[0]
			if fixed.UID != broken.UID {
				t.Errorf("pod %s was replaced by %s, want it repaired in place", broken.Name, fixed.Name)
			}
			if !tc.hostUsers {
				checkOwnUserNamespace(t, fixed)
			}
			if rules := tc.rules(t, fixed); !strings.Contains(rules, "15001") || !strings.Contains(rules, tc.owner) {
				t.Errorf("repaired pod %s has no capture (with %q):\n%s", fixed.Name, tc.owner, rules)
			}
		})
	}
}

// iptablesNat is the pod's nat table as iptables-nft-save in its namespace shows it.
func iptablesNat(t testing.TB, p *corev1.Pod) string {
	return podExec(t, p, "iptables-nft-save", "-t", "nat")
}

// ensureSharedNetnsDir makes the mount holding /var/run/netns shared for the
// test, as it is on systemd hosts (systemd makes / shared at boot): the chart mounts
// it into the agent with HostToContainer propagation for repair in place, which
// containerd refuses on a private mount. containerd does not follow the /var/run
// symlink, so that mount is /. Only / itself changes (not recursively), and it is
// made private again after the test.
func ensureSharedNetnsDir(t testing.TB) {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == "/" {
			if strings.Contains(line, " shared:") || strings.Contains(line, " master:") {
				return
			}
			break
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make / a shared mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make / private again: %v", err)
		}
	})
}
