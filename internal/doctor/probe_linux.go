package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
)

// ProbeOptions say what to send.
type ProbeOptions struct {
	// AppUID is the uid (and gid) the outbound probe runs as: an application's,
	// never the proxy's, whose traffic is not captured.
	AppUID uint32
	// OutboundV4 and OutboundV6 are where the outbound probe connects: an address
	// the pod routes out of its interface, which the capture sends to the proxy.
	OutboundV4, OutboundV6 netip.AddrPort
	// ProbePort is the validation's probe port (Istio's 15002).
	ProbePort uint16
	// Timeout bounds each connection.
	Timeout time.Duration
}

// Default outbound probe targets: documentation addresses (RFC 5737, RFC 3849),
// which nothing answers, so a connection that succeeds was redirected.
var (
	DefaultOutboundV4 = netip.MustParseAddrPort("198.51.100.1:80")
	DefaultOutboundV6 = netip.MustParseAddrPort("[2001:db8::1]:80")
)

// Listener is one of the ports a probe may land on.
type Listener struct {
	Port   uint16 `json:"port"`
	Family string `json:"family"`
	Role   string `json:"role"`
	// Ours: the doctor listens there and reads each connection's original
	// destination; otherwise another process (the proxy) holds the port.
	Ours bool   `json:"ours"`
	Note string `json:"note,omitempty"`
}

// Flow is one test connection and where it landed.
type Flow struct {
	Name   string `json:"name"`
	Family string `json:"family"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Target string `json:"target"`
	// Want is the capture port the flow must land on.
	Want       uint16 `json:"want"`
	Redirected bool   `json:"redirected"`
	// LandedOn is the port that accepted it (0: none known); OriginalDst the
	// destination the listener read back (SO_ORIGINAL_DST).
	LandedOn    uint16 `json:"landedOn,omitempty"`
	OriginalDst string `json:"originalDst,omitempty"`
	Result      string `json:"result"`
}

// ProbeResult is what a probe of a pod found.
type ProbeResult struct {
	Pod       string     `json:"pod"`
	Netns     string     `json:"netns"`
	Listeners []Listener `json:"listeners"`
	Flows     []Flow     `json:"flows"`
	// Redirected: every flow landed where the capture sends it.
	Redirected bool `json:"redirected"`
}

type probeFamily struct {
	name             string
	network          string
	wildcard, source netip.Addr
	passthrough      netip.Addr
	outbound         netip.AddrPort
}

type acceptedConn struct {
	port    uint16
	peer    netip.AddrPort
	origDst string
}

// Probe sends the validation's probe (as the proxy: 127.0.0.1 -> 127.0.0.6:15002,
// which the capture sends to the inbound port) and an application's outbound
// connection through the pod's namespace at nsPath, and reports where each landed.
// It listens on the capture ports only where they are free: when the proxy holds
// them, the connection's fate is read from conntrack instead.
func Probe(ctx context.Context, pod, nsPath, where string, spec redirect.Spec, o ProbeOptions) (*ProbeResult, error) {
	res := &ProbeResult{Pod: pod, Netns: where, Redirected: true}
	families := []probeFamily{{"ipv4", "tcp4", netip.IPv4Unspecified(), netip.MustParseAddr("127.0.0.1"), redirect.InboundPassthroughV4.Addr(), o.OutboundV4}}
	if spec.IPv6 {
		families = append(families, probeFamily{"ipv6", "tcp6", netip.IPv6Unspecified(), netip.IPv6Loopback(), redirect.InboundPassthroughV6.Addr(), o.OutboundV6})
	}
	proxyUID, proxyGID := uint32(redirect.DefaultProxyUID), uint32(redirect.DefaultProxyUID)
	if len(spec.ProxyUIDs) > 0 {
		proxyUID = spec.ProxyUIDs[0]
	}
	if len(spec.ProxyGIDs) > 0 {
		proxyGID = spec.ProxyGIDs[0]
	}
	accepted := make(chan acceptedConn, 64)
	var closers []net.Listener
	defer func() {
		for _, l := range closers {
			l.Close()
		}
	}()
	for _, f := range families {
		for _, l := range []struct {
			port uint16
			role string
		}{
			{spec.ProxyPort, "outbound capture port"},
			{spec.InboundCapturePort, "inbound capture port"},
			{o.ProbePort, "probe port (reached only when not redirected)"},
		} {
			ln, err := listenIn(ctx, nsPath, f.network, netip.AddrPortFrom(f.wildcard, l.port))
			st := Listener{Port: l.port, Family: f.name, Role: l.role, Ours: err == nil}
			switch {
			case err == nil:
				closers = append(closers, ln)
				go acceptLoop(ln.(*net.TCPListener), l.port, accepted)
			case errors.Is(err, unix.EADDRINUSE):
				st.Note = "held by another process (the proxy): connections are not read back, conntrack tells where they went"
			default:
				return nil, fmt.Errorf("probe %s: listen on port %d in %s: %w", pod, l.port, where, err)
			}
			res.Listeners = append(res.Listeners, st)
		}
	}
	for _, f := range families {
		flows := []Flow{
			{Name: "inbound (the validation probe, as the proxy)", Family: f.name, UID: proxyUID, GID: proxyGID,
				Target: netip.AddrPortFrom(f.passthrough, o.ProbePort).String(), Want: spec.InboundCapturePort},
			{Name: "outbound (as an application)", Family: f.name, UID: o.AppUID, GID: o.AppUID,
				Target: f.outbound.String(), Want: spec.ProxyPort},
		}
		for _, fl := range flows {
			src := netip.Addr{}
			if fl.UID == proxyUID {
				src = f.source // the validation binds the loopback source, as Istio's does
			}
			fl = probeFlow(ctx, nsPath, f, fl, src, o, res.Listeners, accepted)
			res.Redirected = res.Redirected && fl.Redirected
			res.Flows = append(res.Flows, fl)
		}
	}
	return res, nil
}

func listenIn(ctx context.Context, nsPath, network string, addr netip.AddrPort) (net.Listener, error) {
	var ln net.Listener
	err := netns.Do(nsPath, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, network, addr.String())
		return err
	})
	return ln, err
}

func acceptLoop(ln *net.TCPListener, port uint16, out chan<- acceptedConn) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		a := acceptedConn{port: port, peer: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
		a.origDst, err = sandbox.OriginalDst(c)
		if err != nil {
			a.origDst = "unknown: " + err.Error()
		}
		c.Close()
		select {
		case out <- a:
		default:
		}
	}
}

// probeFlow makes one connection as fl.UID and says where it landed.
func probeFlow(ctx context.Context, nsPath string, f probeFamily, fl Flow, src netip.Addr, o ProbeOptions, listeners []Listener, accepted <-chan acceptedConn) Flow {
	target := netip.MustParseAddrPort(fl.Target)
	var local netip.AddrPort
	var dialErr error
	var track *netlink.ConntrackFlow
	err := netns.Do(nsPath, func() error {
		// netfilter's owner match reads the socket's file credentials: the thread's
		// fsuid and fsgid at socket creation (netns.Do runs fn on its own thread).
		unix.Setfsgid(int(fl.GID))
		unix.Setfsuid(int(fl.UID))
		defer unix.Setfsgid(0)
		defer unix.Setfsuid(0)
		// setfsuid(2) reports no error: without CAP_SETUID/CAP_SETGID (an agent pod
		// without troubleshooting.enabled) the thread silently stays root, and the
		// probe would test root's traffic, not the uid's. -1 reads the current value.
		if uid, _ := unix.SetfsuidRetUid(-1); uid != int(fl.UID) {
			return fmt.Errorf("cannot connect as uid %d (the fsuid stays %d): this process lacks CAP_SETUID "+
				"(in the agent pod: install with troubleshooting.enabled=true)", fl.UID, uid)
		}
		if gid, _ := unix.SetfsgidRetGid(-1); gid != int(fl.GID) {
			return fmt.Errorf("cannot connect as gid %d (the fsgid stays %d): this process lacks CAP_SETGID "+
				"(in the agent pod: install with troubleshooting.enabled=true)", fl.GID, gid)
		}
		d := net.Dialer{Timeout: o.Timeout}
		if src.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		conn, err := d.DialContext(ctx, f.network, target.String())
		if err != nil {
			dialErr = err
			return nil
		}
		local = conn.LocalAddr().(*net.TCPAddr).AddrPort()
		conn.Close()
		track = conntrackFor(f, local, target)
		return nil
	})
	if err != nil {
		fl.Result = "cannot probe: " + err.Error()
		return fl
	}
	held := func(port uint16) bool {
		for _, l := range listeners {
			if l.Port == port && l.Family == f.name {
				return !l.Ours
			}
		}
		return false
	}
	if dialErr != nil {
		switch {
		case errors.Is(dialErr, unix.ENETUNREACH), errors.Is(dialErr, unix.EHOSTUNREACH):
			fl.Result = fmt.Sprintf("cannot tell: the pod has no route to %s (pass --outbound-target with an address it routes)", target)
		case errors.Is(dialErr, unix.ECONNREFUSED):
			fl.Result = fmt.Sprintf("NOT redirected: the connection to %s was refused", target)
			if held(fl.Want) {
				fl.Result += fmt.Sprintf(" (port %d is held by another process, but the connection did not reach it)", fl.Want)
			}
		case errors.Is(dialErr, os.ErrDeadlineExceeded) || strings.Contains(dialErr.Error(), "i/o timeout"):
			fl.Result = fmt.Sprintf("NOT redirected: no answer from %s within %s (the connection left the pod as sent)", target, o.Timeout)
		default:
			fl.Result = fmt.Sprintf("NOT redirected: %v", dialErr)
		}
		return fl
	}
	wait := time.NewTimer(o.Timeout)
	defer wait.Stop()
	for {
		select {
		case a := <-accepted:
			if a.peer.Addr().Unmap() != local.Addr().Unmap() || a.peer.Port() != local.Port() {
				continue // an earlier flow's straggler, or someone else's
			}
			fl.LandedOn, fl.OriginalDst = a.port, a.origDst
			switch {
			case a.port == o.ProbePort && a.port != fl.Want:
				fl.Result = fmt.Sprintf("NOT redirected: reached %s directly", target)
			case a.port != fl.Want:
				fl.Result = fmt.Sprintf("NOT redirected as required: landed on port %d, not %d (original destination %s)", a.port, fl.Want, a.origDst)
			case a.origDst != target.String():
				fl.Result = fmt.Sprintf("redirected to %d, but the original destination reads %s, not %s", a.port, a.origDst, target)
			default:
				fl.Redirected = true
				fl.Result = fmt.Sprintf("redirected to %d (original destination preserved)", a.port)
			}
			return fl
		case <-wait.C:
			// Someone else accepted it: the proxy, when it holds the wanted port.
			switch {
			case track != nil && track.Reverse.SrcPort == fl.Want:
				fl.Redirected, fl.LandedOn = true, fl.Want
				fl.Result = fmt.Sprintf("redirected to %d (conntrack; the proxy's listener accepted it)", fl.Want)
			case track != nil && track.Reverse.SrcPort == target.Port():
				fl.Result = fmt.Sprintf("NOT redirected: %s answered directly (conntrack)", target)
			case track != nil:
				fl.LandedOn = track.Reverse.SrcPort
				fl.Result = fmt.Sprintf("NOT redirected as required: landed on port %d, not %d (conntrack)", track.Reverse.SrcPort, fl.Want)
			case held(fl.Want):
				fl.Redirected, fl.LandedOn = true, fl.Want
				fl.Result = fmt.Sprintf("connected, and accepted by the process holding port %d (conntrack could not confirm)", fl.Want)
			default:
				fl.Result = fmt.Sprintf("connected to %s, but none of the listeners saw it", target)
			}
			return fl
		case <-ctx.Done():
			fl.Result = "cannot probe: " + ctx.Err().Error()
			return fl
		}
	}
}

// conntrackFor finds the connection's conntrack entry in the current namespace;
// its reply tuple names the port that really answered. nil when conntrack cannot
// be read (no nf_conntrack_netlink).
func conntrackFor(f probeFamily, local, target netip.AddrPort) *netlink.ConntrackFlow {
	fam := netlink.FAMILY_V4
	if f.name == "ipv6" {
		fam = netlink.FAMILY_V6
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(fam))
	if err != nil {
		return nil
	}
	for _, c := range flows {
		dst, _ := netip.AddrFromSlice(c.Forward.DstIP)
		if c.Forward.Protocol == unix.IPPROTO_TCP && c.Forward.SrcPort == local.Port() &&
			c.Forward.DstPort == target.Port() && dst.Unmap() == target.Addr() {
			return c
		}
	}
	return nil
}

// Text renders a probe for people.
func (r *ProbeResult) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Probe of pod %s in %s\n", r.Pod, r.Netns)
	for _, l := range r.Listeners {
		owner := "listening (the doctor)"
		if !l.Ours {
			owner = l.Note
		}
		fmt.Fprintf(&b, "  port %d %s, %s: %s\n", l.Port, l.Family, l.Role, owner)
	}
	b.WriteString("\n")
	for _, f := range r.Flows {
		fmt.Fprintf(&b, "%s %s, uid %d gid %d -> %s: %s\n", strings.SplitN(f.Name, " ", 2)[0], f.Family, f.UID, f.GID, f.Target, f.Result)
		if rest := strings.SplitN(f.Name, " ", 2); len(rest) == 2 {
			fmt.Fprintf(&b, "  %s\n", strings.Trim(rest[1], "()"))
		}
	}
	b.WriteString("\n")
	if r.Redirected {
		b.WriteString("Result: traffic is redirected to the proxy; the istio-validation init container passes.\n")
	} else {
		b.WriteString("Result: traffic is NOT redirected as the pod requires: the istio-validation init container fails (exit 126) " +
			"and app traffic bypasses the sidecar; run `istio-cni-doctor inspect` on the pod to see which rules are missing.\n")
	}
	return b.String()
}
