package capture_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestAUserNamespacedPodIsCapturedByEveryBackend: the network namespace of a pod
// with hostUsers: false belongs to the pod's user namespace, where the kernel
// takes an iptables owner match (the proxy's uid and gid) only from a writer
// inside that user namespace and reads its ids as the pod's: the iptables
// backends run their tools there (before, the restore failed with "Invalid
// argument", and then the backend refused the pod), the nftables backends need
// not. Every backend captures the pod as any other, in a real namespace owned by
// a real user namespace (the pod's uids 0-65535 are the node's 100000 on): real
// connections from the pod's app (its uid 1000) go to the proxy's outbound
// port, the proxy's (1337) bypass it, a peer's connection to the pod lands on
// the inbound port; CHECK finds nothing missing or cut and nothing that
// differs; DEL removes every rule, after which the app reaches the peer
// directly and CHECK finds none of the capture's rules. No native write of
// iptables-nft is tried for it: the kernel would refuse it too.
func TestAUserNamespacedPodIsCapturedByEveryBackend(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	plan := specs.Sidecar().Plan(t)
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			tp, err := sandbox.NewUserNamespaced(t, t.TempDir(), "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tp.Close() })
			serveAs(t, tp.Pod, 0, "outbound", "tcp4", "0.0.0.0:15001", false)
			serveAs(t, tp.Pod, 0, "inbound", "tcp4", "0.0.0.0:15006", false)
			serveAs(t, tp.Pod, 0, "app", "tcp4", "0.0.0.0:8080", false)
			serveAs(t, tp.Peer, 0, "peer", "tcp4", "0.0.0.0:80", false)
			land := func(from string, dst netip.AddrPort) string {
				t.Helper()
				if from == "peer" {
					return sandbox.ProbeFrom(tp.Peer, "tcp", dst)
				}
				uid := uint32(testns.UserNamespaceBase + appUID)
				if from == "proxy" {
					uid = testns.UserNamespaceBase + proxyUID
				}
				got, err := sandbox.ProbeAs(tp.Pod, selfCopy, uid, "tcp", dst, "-test.run=^$")
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			appOut := ap(sandbox.PeerV4, 80)
			// The kernel refuses an owner match written from outside the pod's user
			// namespace, natively as by a restore: no native write may be tried and
			// refused (every such pod's ADD would log the refusal).
			var refused []error
			ctx := iptables.WithNativeFallbacks(ctx, &refused)

			if _, err := capture.Apply(ctx, tp.Pod, b, plan); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			for _, f := range []struct {
				name, from string
				dst        netip.AddrPort
				want       string
			}{
				{"app outbound is captured with its original destination", "app", appOut, "outbound 10.88.0.1:80"},
				{"proxy outbound is not captured", "proxy", appOut, "peer 10.88.0.1:80"},
				{"inbound is captured with its original destination", "peer", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
				{"proxy calling its own pod IP goes through inbound capture", "proxy", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
				{"app calling its own pod IP is not captured", "app", ap(podV4, 8080), "app 10.88.0.2:8080"},
			} {
				if got := land(f.from, f.dst); got != f.want {
					t.Errorf("%s: tcp %s from the %s landed on %q, want %q", f.name, f.dst, f.from, got, f.want)
				}
			}
			broken, differ, err := capture.Check(ctx, tp.Pod, b, plan)
			if err != nil || len(broken) > 0 || len(differ) > 0 {
				t.Errorf("CHECK after the ADD: broken %q, differing %q, %v; want the capture whole", broken, differ, err)
			}

			if _, err := capture.Cleanup(ctx, tp.Pod, b, plan); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if got := land("app", appOut); got != "peer 10.88.0.1:80" {
				t.Errorf("after DEL: the app's tcp %s landed on %q, want the peer", appOut, got)
			}
			broken, _, err = capture.Check(ctx, tp.Pod, b, plan)
			if err != nil || !slices.Contains(broken, "none of the capture's rules is in the namespace") {
				t.Errorf("CHECK after DEL: broken %q, %v; want none of the capture's rules left", broken, err)
			}
			if len(refused) > 0 {
				t.Errorf("native writes the kernel refused, then restored: %v", refused)
			}
		})
	}
}
