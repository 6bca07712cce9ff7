package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/timing"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
)

// foreignOfIstioTProxySave is istioTProxySave without Istio's rules and chains:
// what a cleanup must leave.
const foreignOfIstioTProxySave = `*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -p udp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A PREROUTING -i eth0 -p tcp -j RETURN
-A OUTPUT -o lo -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT ! -d 10.0.0.0/8 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT -o lo -p tcp -m mark --mark 0x539 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -i eth0 -j ACCEPT
-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN
-A OUTPUT ! -o eth9 -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i eth9 -j RETURN
-A OUTPUT -o eth9 -j RETURN
COMMIT
`

// TestCleanupRemovesIstiosLayoutInRealNamespace: in a namespace Istio's
// istio-iptables programmed (its TPROXY layout with an excluded interface, as
// iptables-restore input) beside foreign rules that look like Istio's, a cleanup
// leaves exactly the foreign rules, in legacy mode and in nft mode, where the
// native removal leaves the family to the restore without reporting a refusal.
func TestCleanupRemovesIstiosLayoutInRealNamespace(t *testing.T) {
	root.Require(t)
	for _, mode := range modes(t) {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			b, err := NewBackend(Config{Mode: mode, LockDir: dir, NativeStateDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if mode == ModeNFT && !b.nativeAllowed() {
				t.Fatalf("this machine's iptables-nft is older than %v: the native path is not tested", nativeMinVersion)
			}
			restore := "iptables-" + string(mode) + "-restore"
			save := "iptables-" + string(mode) + "-save"
			istio, control := newNS(t), newNS(t)
			restoreIn(t, istio, restore, istioTProxySave)
			restoreIn(t, control, restore, foreignOfIstioTProxySave)
			want := rulestext.Saved(runIn(t, control, save))

			var refused []error
			rec := timing.Start()
			ctx := timing.With(WithNativeFallbacks(context.Background(), &refused), rec)
			if _, err := capture.Cleanup(ctx, istio, b, nil); err != nil {
				t.Fatal(err)
			}
			if got := rulestext.Saved(runIn(t, istio, save)); got != want {
				t.Errorf("after cleanup:\n%s\nwant only the foreign rules:\n%s", got, want)
			}
			if len(refused) > 0 {
				t.Errorf("cleanup reported refusals: %v", refused)
			}
			if mode == ModeNFT {
				var ran []string
				for _, p := range rec.Phases() {
					ran = append(ran, p.Name)
				}
				if !strings.Contains(strings.Join(ran, " "), "iptables-native-cleanup-ipv4 iptables-save-ipv4 iptables-restore-ipv4") {
					t.Errorf("cleanup's steps %q: want the native path to leave IPv4 to the restore", ran)
				}
			}
		})
	}
}
