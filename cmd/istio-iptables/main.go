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
	"os/signal"
	"syscall"

	"github.com/istio-cni/istio-cni/internal/istioiptables"
)

func main() {
	cfg, err := istioiptables.ParseConfig(os.Args[1:], os.LookupEnv)
	if errors.Is(err, istioiptables.ErrHelp) {
		fmt.Print(istioiptables.Usage())
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "istio-iptables: %v\n", err)
		os.Exit(1)
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if cfg.LogJSON {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	slog.SetDefault(slog.New(h))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = istioiptables.Run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "istio-iptables: %v\n", err)
		os.Exit(istioiptables.ExitCode(err))
	}
}
