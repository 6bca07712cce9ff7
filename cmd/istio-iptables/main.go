// Command istio-iptables sets up, prints, removes or validates the traffic capture
// of an Istio sidecar. It accepts Istio's istio-iptables flags and environment
// variables; see --help.
package main

import (
	"context"
	"log/slog"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/istioiptables"
)

func main() {
	cfg := cli.Parse("istio-iptables", istioiptables.ParseConfig, istioiptables.ErrHelp, istioiptables.Usage)
	slog.SetDefault(cli.Logger(cfg.LogLevel, cfg.LogJSON))

	err := cli.RunUntilSignal(func(ctx context.Context) error { return istioiptables.Run(ctx, cfg) })
	cli.Exit("istio-iptables", err, istioiptables.ExitCode(err))
}
