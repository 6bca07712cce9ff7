package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Serve starts a control plane, copies its admin kubeconfig to kubeconfigPath (when
// set), tells out how to use it, and keeps it running until ctx ends; then it
// stops the control plane and removes the copy. It is the body of the
// controlplane command behind hack/controlplane.sh.
func Serve(ctx context.Context, opts Options, kubeconfigPath string, out io.Writer) (err error) {
	cp, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := cp.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	path := cp.AdminKubeconfig()
	if kubeconfigPath != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read admin kubeconfig: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(kubeconfigPath), 0o700); err != nil {
			return fmt.Errorf("create kubeconfig dir: %w", err)
		}
		// Written by rename: hack/controlplane.sh treats the file's appearance as
		// "ready" and must never read half of it.
		tmp := kubeconfigPath + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return fmt.Errorf("write kubeconfig %s: %w", kubeconfigPath, err)
		}
		if err := os.Rename(tmp, kubeconfigPath); err != nil {
			return fmt.Errorf("write kubeconfig %s: %w", kubeconfigPath, err)
		}
		defer os.Remove(kubeconfigPath)
		path = kubeconfigPath
	}
	fmt.Fprintf(out, "control plane up in %v at %s\nexport KUBECONFIG=%s\n", cp.StartupDuration().Round(time.Millisecond), cp.Host(), path)
	<-ctx.Done()
	return nil
}
