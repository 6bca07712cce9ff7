// Package cli is the start-up the long-running commands (install-cni,
// istio-iptables) share, so that they log, stop and fail the same way. Its log
// levels (Level) are the plugin's too: every binary reads Istio's level names alike.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/istio-cni/istio-cni/internal/version"
)

// Logger is a command's own log on stderr: text, or JSON when asked, at level.
// stdout is left to the command's output (istio-iptables' dry run prints rules).
func Logger(level slog.Level, json bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if json {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	return slog.New(h)
}

// RunUntilSignal runs f with a context that ends on SIGINT or SIGTERM (the
// kubelet's stop), so that f can clean up before the command exits. Signals stay
// caught while f runs (a second SIGTERM does not cut the clean-up short); once f
// returns, the default handling is back.
func RunUntilSignal(f func(ctx context.Context) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := f(ctx)
	stop()
	return err
}

// Parse reads a command's settings from its arguments and environment with
// parse. Asked for help (parse returns help), it prints usage and exits 0; a bad
// setting exits 1, reported as Exit does. `--version` alone prints the command's
// name and build version (internal/version) and exits 0.
func Parse[S any](name string, parse func(args []string, lookupEnv func(string) (string, bool)) (S, error), help error, usage func() string) S {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(name, version.Version)
		os.Exit(0)
	}
	s, err := parse(os.Args[1:], os.LookupEnv)
	if errors.Is(err, help) {
		fmt.Print(usage())
		os.Exit(0)
	}
	Exit(name, err, 1)
	return s
}

// Exit reports err on stderr prefixed with the command's name and exits with code;
// a nil err returns.
func Exit(name string, err error, code int) {
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(code)
}
