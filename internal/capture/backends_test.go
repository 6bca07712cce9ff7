package capture_test

import (
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/nftables"
)

// backendFactories are the backends every capture test runs with: iptables in both
// flavours and nftables through nft and over netlink.
var backendFactories = map[string]func(tb testing.TB) (capture.Backend, error){
	"iptables-nft": func(tb testing.TB) (capture.Backend, error) {
		dir := tb.TempDir()
		return iptables.NewBackend(iptables.Config{Mode: iptables.ModeNFT, LockDir: dir, NativeStateDir: dir})
	},
	"iptables-legacy": func(tb testing.TB) (capture.Backend, error) {
		return iptables.NewBackend(iptables.Config{Mode: iptables.ModeLegacy, LockDir: tb.TempDir()})
	},
	"nftables-exec":    func(testing.TB) (capture.Backend, error) { return nftables.NewExecBackend(), nil },
	"nftables-netlink": func(testing.TB) (capture.Backend, error) { return nftables.NewBackend(), nil },
}
