package capture_test

import (
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/nftables"
)

func init() {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		registerBackend("iptables-"+string(mode), func(t *testing.T) (capture.Backend, error) {
			return iptables.NewBackend(iptables.Config{Mode: mode, LockDir: t.TempDir()})
		})
	}
}

func init() {
	registerBackend("nftables-exec", func(t *testing.T) (capture.Backend, error) {
		return nftables.NewExecBackend(), nil
	})
}

func init() {
	registerBackend("nftables-netlink", func(t *testing.T) (capture.Backend, error) {
		return nftables.NewBackend(), nil
	})
}
