// Command istio-iptables sets up, prints, removes or validates the traffic capture
// of an Istio sidecar. It accepts Istio's istio-iptables flags and environment
// variables; see --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/istioiptables"
)

func main() {
	cfg, err := istioiptables.ParseConfig(os.Args[1:], os.LookupEnv)
	if errors.Is(err, istioiptables.ErrHelp) {
		fmt.Print(istioiptables.Usage())
		return
	}
	cli.Exit("istio-iptables", err, 1)
	slog.SetDefault(cli.Logger(cfg.LogLevel, cfg.LogJSON))

	err = cli.RunUntilSignal(func(ctx context.Context) error { return istioiptables.Run(ctx, cfg) })
	cli.Exit("istio-iptables", err, istioiptables.ExitCode(err))
}
