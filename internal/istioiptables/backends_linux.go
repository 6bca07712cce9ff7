package istioiptables

import (
	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// The only place that knows the backends' constructors.

func newBackend(cfg Config) (capture.Backend, error) {
	if cfg.NativeNftables {
		if cfg.CleanupOnly {
			// As Istio's --cleanup-only, which deletes its own tables: a
			// namespace Istio's tool programmed is cleaned up by this one.
			return nftables.NewBackend().WithIstioTables(), nil
		}
		return nftables.NewBackend(), nil
	}
	return iptables.NewBackend(iptables.Config{Mode: cfg.IptablesMode})
}

func renderNftables(plan *redirect.Plan) (string, error) {
	return nftables.Render(plan)
}
