// Command controlplane runs a throwaway etcd and kube-apiserver until interrupted;
// see hack/controlplane.sh.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "also write the admin kubeconfig to this path (removed on exit)")
	binDir := flag.String("bin-dir", "", "directory holding etcd and kube-apiserver (default: $KUBE_BIN_DIR, else hack/kube-binaries.sh)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := controlplane.Serve(ctx, controlplane.Options{BinDir: *binDir}, *kubeconfig, os.Stdout); err != nil {
		slog.Error("controlplane", "err", err)
		os.Exit(1)
	}
}
