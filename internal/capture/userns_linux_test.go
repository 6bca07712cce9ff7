package capture_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// podUsernsBase is where a user-namespaced pod's uids start on the node: its uid
// 0 is the node's 100000, so its proxy (1337) is the node's 101337.
const podUsernsBase = 100000

// userNamespacedPodNetns returns the network namespace of a pod with hostUsers:
// false as containerd 2 and CRI-O make it: created inside the pod's own user
// namespace, which maps the pod's uids 0-65535 to the node's podUsernsBase on. It
// is held by a sleeping process of that namespace, and named as cri-dockerd names
// a pod's namespace, /proc/PID/ns/net.
func userNamespacedPodNetns(t *testing.T) string {
	t.Helper()
	holder := exec.Command("sleep", "3600")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: podUsernsBase, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: podUsernsBase, Size: 65536}},
	}
	if err := holder.Start(); err != nil {
		t.Fatalf("start a process in a user and network namespace of its own: %v", err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	ns := fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)
	if err := netns.Do(ns, func() error {
		if err := sandbox.LoopbackAddr(podV4); err != nil {
			return err
		}
		return sandbox.LoopedDefaultRoute()
	}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestAUserNamespacedPodIsCapturedByNftablesAndRefusedByIptablesSayingWhy: the
// network namespace of a pod with hostUsers: false belongs to the pod's user
// namespace. There the kernel refuses an iptables owner match (the proxy's uid
// and gid) written from outside that user namespace, as the plugin writes: the
// iptables backends must refuse such a namespace saying so and naming the backend
// that captures it, not fail on the first uid rule with the kernel's bare
// "Invalid argument". The nftables backends capture it, the proxy's uid read as
// the pod sees it: real connections from the pod's app (its uid 1000) and proxy
// (1337) land where they land in any other pod.
func TestAUserNamespacedPodIsCapturedByNftablesAndRefusedByIptablesSayingWhy(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	plan := specs.Sidecar().Plan(t)
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ns := userNamespacedPodNetns(t)
			_, err := capture.Apply(ctx, ns, b, plan)
			if strings.HasPrefix(name, "iptables") {
				if err == nil || !strings.Contains(err.Error(), "user namespace") || !strings.Contains(err.Error(), "native_nftables") {
					t.Errorf("Apply in a user-namespaced pod's namespace: %v, want a refusal naming its user namespace and native_nftables", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			serveAs(t, ns, 0, "outbound", "tcp4", "0.0.0.0:15001", false)
			serveAs(t, ns, 0, "inbound", "tcp4", "0.0.0.0:15006", false)
			serveAs(t, ns, 0, "app", "tcp4", "0.0.0.0:8080", false)
			for _, f := range []struct {
				name string
				uid  uint32
				dst  netip.AddrPort
				want string
			}{
				{"app outbound is captured", podUsernsBase + appUID, ap(netip.MustParseAddr("10.77.0.9"), 443), "outbound 10.77.0.9:443"},
				{"proxy calling its own pod IP goes through inbound capture", podUsernsBase + proxyUID, ap(podV4, 8080), "inbound 10.88.0.2:8080"},
				{"app calling its own pod IP is not captured", podUsernsBase + appUID, ap(podV4, 8080), "app 10.88.0.2:8080"},
			} {
				got, err := sandbox.ProbeAs(ns, selfCopy, f.uid, "tcp", f.dst, "-test.run=^$")
				if err != nil {
					t.Fatal(err)
				}
				if got != f.want {
					t.Errorf("%s: tcp %s from node uid %d landed on %q, want %q", f.name, f.dst, f.uid, got, f.want)
				}
			}
			if _, err := capture.Cleanup(ctx, ns, b, plan); err != nil {
				t.Errorf("Cleanup: %v", err)
			}
		})
	}
}
