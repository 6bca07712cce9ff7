// Command install-cni is the istio-cni node agent: it installs the istio-cni plugin
// on the node, keeps its config entry in place, relays the plugin's logs, serves the
// node's pods to the plugin, repairs pods started before the plugin was in place,
// optionally keeps the node readiness taint, and removes everything on SIGTERM.
// Settings: --help, or internal/agent/README.md.
package main

import (
	"context"
	"os"

	"github.com/istio-cni/istio-cni/internal/agent"
	"github.com/istio-cni/istio-cni/internal/cli"
)

func main() {
	s := cli.Parse("install-cni", agent.Parse, agent.ErrHelp, agent.Usage)
	log := cli.Logger(s.LogLevel, s.LogJSON)
	err := cli.RunUntilSignal(func(ctx context.Context) error { return agent.Run(ctx, s, os.Stdout, log) })
	cli.Exit("install-cni", err, 1)
}
