// Command install-cni is the istio-cni node agent: it installs the istio-cni plugin
// on the node, keeps its config entry in place, relays the plugin's logs, serves the
// node's pods to the plugin, repairs pods started before the plugin was in place,
// optionally keeps the node readiness taint, and removes everything on SIGTERM.
// Settings: --help, or internal/agent/README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/istio-cni/istio-cni/internal/agent"
)

func main() {
	s, err := agent.Parse(os.Args[1:], os.LookupEnv)
	if errors.Is(err, agent.ErrHelp) {
		fmt.Print(agent.Usage())
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "install-cni: %v\n", err)
		os.Exit(1)
	}
	opts := &slog.HandlerOptions{Level: s.LogLevel}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if s.LogJSON {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	log := slog.New(h)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = agent.Run(ctx, s, os.Stdout, log)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "install-cni: %v\n", err)
		os.Exit(1)
	}
}
