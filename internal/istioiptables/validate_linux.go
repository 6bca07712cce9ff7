package istioiptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/probe"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Validation is what Istio's istio-validation init container does in a pod whose
// capture istio-cni programmed: prove that the pod's traffic really reaches the
// proxy's ports, and fail the pod (exit 126) if it does not.
//
// How the probe gets captured, as in Istio: the container runs as the proxy uid
// (1337) and connects from 127.0.0.1 to 127.0.0.6:15002 (::1 -> ::6 for IPv6).
// That is the proxy talking to a non-loopback-range address over lo, so in
// ISTIO_OUTPUT the proxy's "call myself through a service VIP" rule matches first:
//
//	-o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
//
// which REDIRECTs the connection to the inbound capture port 15006, where our
// listener reads SO_ORIGINAL_DST and finds 127.0.0.6:15002. The inbound passthrough
// rule (-s 127.0.0.6 -o lo -j RETURN) cannot match because the source is bound to
// 127.0.0.1. From any other uid the same connection would match "-o lo ! --uid-owner
// 1337 -j RETURN" (an app talking to itself) and stay uncaptured, so the probe only
// proves something when run as the proxy uid (or gid); when it is not, the failure
// says so.
//
// Like Istio we listen on both capture ports (15001 and 15006). Unlike Istio we
// also listen on the probe port itself: a connection arriving there was certainly
// not redirected, which gives a precise failure instead of "connection refused".

const probeRetryInterval = 250 * time.Millisecond

func validate(ctx context.Context, log *slog.Logger, cfg Config, spec redirect.Spec) error {
	families := probe.Families(spec.IPv6)
	log.Info("validating that traffic is redirected to the proxy", "timeout", cfg.ProbeTimeout, "probePort", cfg.ProbePort)
	deadline := time.Now().Add(cfg.ProbeTimeout)
	var failures []string
	err := inNamespace(cfg.NetworkNamespace, func() error {
		for _, f := range families {
			failure, err := probeFamily(ctx, log, f, spec, cfg.ProbePort, deadline)
			if err != nil {
				return err
			}
			if failure != "" {
				failures = append(failures, failure)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("validation: %w", err)
	}
	if len(failures) > 0 {
		return &NotRedirectedError{Failures: failures, Hint: identityHint(spec, os.Getuid(), os.Getgid())}
	}
	log.Info("validation passed: traffic is redirected to the proxy")
	return nil
}

// identityHint explains a failure that is certain when the probe does not run as
// the proxy: only the proxy's own loopback traffic is sent to the inbound port.
func identityHint(spec redirect.Spec, uid, gid int) string {
	if uid >= 0 && slices.Contains(spec.ProxyUIDs, uint32(uid)) || gid >= 0 && slices.Contains(spec.ProxyGIDs, uint32(gid)) {
		return ""
	}
	return fmt.Sprintf("Note: validation ran as uid %d gid %d, but only the proxy's loopback traffic (uid %v, gid %v) "+
		"is redirected to the inbound capture port; run it as the proxy uid, as Istio's istio-validation container does.",
		uid, gid, spec.ProxyUIDs, spec.ProxyGIDs)
}

// probeFamily connects to the family's probe address until one connection is found
// redirected or the deadline passes (at least one attempt is made). It returns the
// last failure, or "" on success. Errors are for what prevents probing at all. It
// runs in the pod's namespace (the catcher uses the caller's).
func probeFamily(ctx context.Context, log *slog.Logger, f probe.Family, spec redirect.Spec, probePort uint16, deadline time.Time) (string, error) {
	target := netip.AddrPortFrom(f.Passthrough, probePort)
	catcher := probe.NewCatcher("", f)
	defer catcher.Close()
	listeners := []probeListener{
		{"outbound capture port", spec.ProxyPort, true},
		{"inbound capture port", spec.InboundCapturePort, true},
		{"probe port", probePort, false},
	}
	for _, l := range listeners {
		if err := catcher.Listen(ctx, l.port); err != nil {
			return "", fmt.Errorf("listen on the %s %s: %w", l.name, netip.AddrPortFrom(f.Wildcard, l.port), err)
		}
	}

	var last string
	for attempt := 1; ; attempt++ {
		failure := probeOnce(ctx, catcher, f, target, listeners, deadline)
		if failure == "" {
			log.Info("probe redirected", "target", target, "attempt", attempt)
			return "", nil
		}
		last = failure
		log.Debug("probe not redirected", "target", target, "attempt", attempt, "reason", failure)
		if time.Until(deadline) < probeRetryInterval {
			break
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(probeRetryInterval):
		}
	}
	return fmt.Sprintf("a connection to %s %s", target, last), nil
}

// probeListener is one of the ports the probe may land on.
type probeListener struct {
	name     string
	port     uint16
	captured bool // a capture port, not the probe port
}

// probeOnce makes one connection and reports what became of it ("" if redirected).
func probeOnce(ctx context.Context, catcher *probe.Catcher, f probe.Family, target netip.AddrPort, listeners []probeListener, deadline time.Time) string {
	timeout := max(min(time.Until(deadline), time.Second), 100*time.Millisecond)
	out, err := catcher.Send(ctx, probe.Conn{Target: target, Source: f.Loopback, Timeout: timeout})
	if err != nil {
		return err.Error()
	}
	if err := out.DialErr; err != nil {
		switch {
		case errors.Is(err, unix.ECONNREFUSED):
			return "was refused"
		case errors.Is(err, os.ErrDeadlineExceeded):
			return "timed out"
		}
		return fmt.Sprintf("failed: %v", err)
	}
	r := out.Landed
	if r == nil {
		return "connected, but none of our listeners accepted it"
	}
	// The catcher listens on these ports only.
	l := listeners[slices.IndexFunc(listeners, func(l probeListener) bool { return l.port == r.Port })]
	name := fmt.Sprintf("%s %d", l.name, l.port)
	switch {
	case !l.captured:
		return "reached the " + name + " directly"
	case r.Err != nil:
		return fmt.Sprintf("reached the %s, but its original destination is unknown: %v", name, r.Err)
	case r.OriginalDst.Addr().Unmap() != target.Addr() || r.OriginalDst.Port() != target.Port():
		return fmt.Sprintf("reached the %s with original destination %s", name, r.OriginalDst)
	}
	return ""
}
