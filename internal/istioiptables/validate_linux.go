package istioiptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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

// probeFamily is one IP family's probe.
type probeFamily struct {
	network  string     // tcp4 or tcp6
	wildcard netip.Addr // listen address
	source   netip.Addr // the probe's bound source address
	target   netip.Addr // the probe's destination
}

var (
	probeV4 = probeFamily{"tcp4", netip.IPv4Unspecified(), netip.MustParseAddr("127.0.0.1"), redirect.InboundPassthroughV4.Addr()}
	probeV6 = probeFamily{"tcp6", netip.IPv6Unspecified(), netip.IPv6Loopback(), redirect.InboundPassthroughV6.Addr()}
)

const probeRetryInterval = 250 * time.Millisecond

// accepted is what one of our listeners saw.
type accepted struct {
	listener string
	captured bool // accepted on a capture port, not on the probe port
	peer     netip.AddrPort
	origDst  netip.AddrPort
	err      error
}

func validate(ctx context.Context, log *slog.Logger, cfg Config, spec redirect.Spec) error {
	families := []probeFamily{probeV4}
	if spec.IPv6 {
		families = append(families, probeV6)
	}
	log.Info("validating that traffic is redirected to the proxy", "timeout", cfg.ProbeTimeout, "probePort", cfg.ProbePort)
	deadline := time.Now().Add(cfg.ProbeTimeout)
	var failures []string
	err := inNamespace(cfg.NetworkNamespace, func() error {
		for _, f := range families {
			failure, err := probe(ctx, log, f, spec, cfg.ProbePort, deadline)
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

// probe connects to the family's probe address until one connection is found
// redirected or the deadline passes (at least one attempt is made). It returns the
// last failure, or "" on success. Errors are for what prevents probing at all.
func probe(ctx context.Context, log *slog.Logger, f probeFamily, spec redirect.Spec, probePort uint16, deadline time.Time) (string, error) {
	target := netip.AddrPortFrom(f.target, probePort)
	results := make(chan accepted, 16)
	listeners := []struct {
		name     string
		port     uint16
		captured bool
	}{
		{"outbound capture port", spec.ProxyPort, true},
		{"inbound capture port", spec.InboundCapturePort, true},
		{"probe port", probePort, false},
	}
	for _, l := range listeners {
		addr := netip.AddrPortFrom(f.wildcard, l.port)
		ln, err := (&net.ListenConfig{}).Listen(ctx, f.network, addr.String())
		if err != nil {
			return "", fmt.Errorf("listen on the %s %s: %w", l.name, addr, err)
		}
		defer ln.Close()
		go acceptLoop(ln.(*net.TCPListener), fmt.Sprintf("%s %d", l.name, l.port), l.captured, f.network == "tcp6", results)
	}

	var last string
	for attempt := 1; ; attempt++ {
		failure := probeOnce(ctx, f, target, results, deadline)
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

// probeOnce makes one connection and reports what became of it ("" if redirected).
func probeOnce(ctx context.Context, f probeFamily, target netip.AddrPort, results <-chan accepted, deadline time.Time) string {
	timeout := max(min(time.Until(deadline), time.Second), 100*time.Millisecond)
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.source, 0)), Timeout: timeout}
	conn, err := d.DialContext(ctx, f.network, target.String())
	if err != nil {
		switch {
		case errors.Is(err, unix.ECONNREFUSED):
			return "was refused"
		case errors.Is(err, os.ErrDeadlineExceeded):
			return "timed out"
		}
		return fmt.Sprintf("failed: %v", err)
	}
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	conn.Close()

	wait := time.NewTimer(timeout)
	defer wait.Stop()
	for {
		select {
		case r := <-results:
			if r.peer.Addr().Unmap() != local.Addr().Unmap() || r.peer.Port() != local.Port() {
				continue // someone else's connection
			}
			switch {
			case !r.captured:
				return "reached the " + r.listener + " directly"
			case r.err != nil:
				return fmt.Sprintf("reached the %s, but its original destination is unknown: %v", r.listener, r.err)
			case r.origDst.Addr().Unmap() != target.Addr() || r.origDst.Port() != target.Port():
				return fmt.Sprintf("reached the %s with original destination %s", r.listener, r.origDst)
			}
			return ""
		case <-wait.C:
			return "connected, but none of our listeners accepted it"
		case <-ctx.Done():
			return ctx.Err().Error()
		}
	}
}

func acceptLoop(ln *net.TCPListener, name string, captured, ipv6 bool, results chan<- accepted) {
	for {
		conn, err := ln.AcceptTCP()
		if err != nil {
			return // closed
		}
		r := accepted{listener: name, captured: captured, peer: conn.RemoteAddr().(*net.TCPAddr).AddrPort()}
		if captured {
			r.origDst, r.err = originalDst(conn, ipv6)
		}
		conn.Close()
		select {
		case results <- r:
		default: // nobody is waiting for this many connections: not ours
		}
	}
}

// originalDst reads the destination a NATed connection had before REDIRECT
// (SO_ORIGINAL_DST for IPv4, IP6T_SO_ORIGINAL_DST for IPv6; both are 80).
func originalDst(conn *net.TCPConn, ipv6 bool) (netip.AddrPort, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if ipv6 {
			var sa unix.RawSockaddrInet6
			serr = getsockopt(fd, unix.SOL_IPV6, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
			dst = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), networkOrder(sa.Port))
		} else {
			var sa unix.RawSockaddrInet4
			serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
			dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), networkOrder(sa.Port))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", err)
	}
	return dst, nil
}

func getsockopt(fd uintptr, level, name int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(name), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// networkOrder reads a port stored in network byte order.
func networkOrder(port uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&port))
	return uint16(b[0])<<8 | uint16(b[1])
}
