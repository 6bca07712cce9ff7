// Command node runs a single-node cluster (test/harness/node) until SIGINT or SIGTERM,
// then takes it down; see hack/node/up.sh and down.sh. With -cleanup it removes what
// a node whose process died left behind.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/istio-cni/istio-cni/test/harness/node"
)

func main() {
	state := flag.String("state", node.DefaultStateDir, "state directory (removed on exit)")
	name := flag.String("name", node.DefaultNodeName, "node name")
	cidr := flag.String("pod-cidr", node.DefaultPodCIDR.String(), "pod address range (host-local)")
	cleanup := flag.Bool("cleanup", false, "instead of starting a node, remove what a dead one left in -state")
	flag.Parse()
	podCIDR, err := netip.ParsePrefix(*cidr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "node: -pod-cidr %q: %v\n", *cidr, err)
		os.Exit(2)
	}
	if *cleanup {
		if err := node.Cleanup(*state, podCIDR, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := node.Up(ctx, node.Options{StateDir: *state, NodeName: *name, PodCIDR: podCIDR})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The line the wrapper script waits for.
	fmt.Printf("export KUBECONFIG=%s\n", n.Kubeconfig())
	<-ctx.Done()
	if err := n.Down(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
