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
	"os"

	"github.com/istio-cni/istio-cni/internal/agent"
	"github.com/istio-cni/istio-cni/internal/cli"
)

func main() {
	s, err := agent.Parse(os.Args[1:], os.LookupEnv)
	if errors.Is(err, agent.ErrHelp) {
		fmt.Print(agent.Usage())
		return
	}
	cli.Exit("install-cni", err, 1)
	log := cli.Logger(s.LogLevel, s.LogJSON)
	err = cli.RunUntilSignal(func(ctx context.Context) error { return agent.Run(ctx, s, os.Stdout, log) })
	cli.Exit("install-cni", err, 1)
}
