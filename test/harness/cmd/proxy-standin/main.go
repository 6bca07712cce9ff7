// Command proxy-standin stands in for Istio's sidecar (istio-proxy) and for a
// sample application, so the capture can be seen on live traffic without Envoy.
//
//	proxy-standin proxy sidecar   the sidecar: 15001 outbound, 15006 inbound, 15021 health
//	proxy-standin app             an HTTP server on :8080 that answers with its pod's name
//	proxy-standin get URL         one HTTP GET; prints the answer, exits 3 when the
//	                              request fails (1 on any other error), so a caller
//	                              running it through kubectl exec tells a failed
//	                              request from a failed exec
//
// The proxy reads each redirected connection's original destination
// (SO_ORIGINAL_DST, IPv4 and IPv6), logs one line to stdout ("outbound
// 10.244.0.7:8080 via proxy", "inbound 10.244.0.7:8080 via proxy") and forwards the
// bytes there. It must run as the proxy's uid (1337) so that its own outbound
// connections are not captured again; inbound it connects from 127.0.0.6 (::6),
// which the capture lets through as Istio's inbound passthrough.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "proxy-standin:", err)
		if errors.Is(err, errRequest) {
			os.Exit(ExitRequestFailed)
		}
		os.Exit(1)
	}
}

// ExitRequestFailed is get's exit status when its request failed (no answer, or
// not 200 OK); test/nodee2e/meshnode keeps the same number.
const ExitRequestFailed = 3

// errRequest marks get's errors that are the request's own.
var errRequest = errors.New("request failed")

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: proxy-standin proxy sidecar | app | get URL")
	}
	switch args[0] {
	case "proxy":
		if len(args) < 2 || args[1] != "sidecar" {
			return fmt.Errorf("proxy: only the sidecar role is supported (args: proxy sidecar)")
		}
		return runProxy(ctx, proxyConfig{Outbound: 15001, Inbound: 15006, Health: 15021})
	case "app":
		port := 8080
		if len(args) > 1 {
			if _, err := fmt.Sscan(args[1], &port); err != nil {
				return fmt.Errorf("app: port %q: %w", args[1], err)
			}
		}
		return runApp(ctx, port)
	case "get":
		if len(args) != 2 {
			return fmt.Errorf("usage: proxy-standin get URL")
		}
		if err := get(ctx, args[1], 5*time.Second, os.Stdout); err != nil {
			return fmt.Errorf("%w: %w", errRequest, err)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q: want proxy, app or get", args[0])
}
