package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/probe"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// ProbeOptions say what to send.
type ProbeOptions struct {
	// AppUID is the uid (and gid) the outbound probe runs as: an application's,
	// never the proxy's, whose traffic is not captured.
	AppUID uint32
	// OutboundV4 and OutboundV6 are where the outbound probe connects: an address
	// the pod routes out of its interface, which the capture sends to the proxy.
	// Unless OutboundNamed (the user gave them), a target the pod's settings do not
	// capture is replaced by one they capture (outboundTarget).
	OutboundV4, OutboundV6 netip.AddrPort
	OutboundNamed          bool
	// ProbePort is the validation's probe port (Istio's 15002).
	ProbePort uint16
	// Timeout bounds each connection.
	Timeout time.Duration
	// Proc is the /proc directory of a process of the pod (repair.Netns.Proc): a pod
	// with hostUsers: false has a user namespace of its own, whose id maps, read
	// there, turn the pod's uids and gids into the node's the probe connects as.
	Proc string
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
	// NodeUID and NodeGID are UID and GID as the node sees them, when the pod has a
	// user namespace of its own (hostUsers: false): the ids the probe connects as.
	NodeUID *uint32 `json:"nodeUid,omitempty"`
	NodeGID *uint32 `json:"nodeGid,omitempty"`
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

// probeFamily is one family's probe: its catcher and the outbound target.
type probeFamily struct {
	probe.Family
	outbound netip.AddrPort
	catcher  *probe.Catcher
}

// Probe sends the validation's probe (as the proxy: 127.0.0.1 -> 127.0.0.6:15002,
// which the capture sends to the inbound port) and an application's outbound
// connection through the pod's namespace at nsPath, and reports where each landed.
// It listens on the capture ports only where they are free: when the proxy holds
// them, the connection's fate is read from conntrack instead.
func Probe(ctx context.Context, pod, nsPath, where string, spec redirect.Spec, o ProbeOptions) (*ProbeResult, error) {
	res := &ProbeResult{Pod: pod, Netns: where, Redirected: true}
	ids, err := podIdentities(nsPath, o.Proc)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", pod, err)
	}
	var families []probeFamily
	for _, f := range probe.Families(spec.IPv6) {
		outbound := o.OutboundV4
		if f == probe.IPv6 {
			outbound = o.OutboundV6
		}
		families = append(families, probeFamily{f, outbound, probe.NewCatcher(nsPath, f)})
	}
	defer func() {
		for _, f := range families {
			f.catcher.Close()
		}
	}()
	proxyUID, proxyGID := uint32(redirect.DefaultProxyUID), uint32(redirect.DefaultProxyUID)
	if len(spec.ProxyUIDs) > 0 {
		proxyUID = spec.ProxyUIDs[0]
	}
	if len(spec.ProxyGIDs) > 0 {
		proxyGID = spec.ProxyGIDs[0]
	}
	for _, f := range families {
		for _, l := range []struct {
			port uint16
			role string
		}{
			{spec.ProxyPort, "outbound capture port"},
			{spec.InboundCapturePort, "inbound capture port"},
			{o.ProbePort, "probe port (reached only when not redirected)"},
		} {
			err := f.catcher.Listen(ctx, l.port)
			st := Listener{Port: l.port, Family: f.Name, Role: l.role, Ours: err == nil}
			switch {
			case err == nil:
			case errors.Is(err, unix.EADDRINUSE):
				st.Note = "held by another process (the proxy): connections are not read back, conntrack tells where they went"
			default:
				return nil, fmt.Errorf("probe %s: listen on port %d in %s: %w", pod, l.port, where, err)
			}
			res.Listeners = append(res.Listeners, st)
		}
	}
	for _, f := range families {
		outbound, cannotTell := outboundTarget(spec, f.outbound, o.OutboundNamed)
		flows := []Flow{
			{Name: "inbound (the validation probe, as the proxy)", Family: f.Name, UID: proxyUID, GID: proxyGID,
				Target: netip.AddrPortFrom(f.Passthrough, o.ProbePort).String(), Want: spec.InboundCapturePort},
		}
		if cannotTell != "" {
			// Nothing to learn from a connection the pod's settings leave alone: it is
			// reported, not made, and does not count as traffic that escaped.
			flows = append(flows, Flow{Name: "outbound (as an application)", Family: f.Name, UID: o.AppUID, GID: o.AppUID,
				Target: f.outbound.String(), Want: spec.ProxyPort, Result: cannotTell})
		} else {
			flows = append(flows, Flow{Name: "outbound (as an application)", Family: f.Name, UID: o.AppUID, GID: o.AppUID,
				Target: outbound.String(), Want: spec.ProxyPort})
		}
		for _, fl := range flows {
			if fl.Result != "" {
				res.Flows = append(res.Flows, fl)
				continue
			}
			src := netip.Addr{}
			if fl.UID == proxyUID {
				src = f.Loopback // the validation binds the loopback source, as Istio's does
			}
			if err := ids.toNode(&fl); err != nil {
				return nil, fmt.Errorf("probe %s: %w", pod, err)
			}
			fl, tells := probeFlow(ctx, f, fl, src, o, res.Listeners)
			res.Redirected = res.Redirected && (fl.Redirected || !tells)
			res.Flows = append(res.Flows, fl)
		}
	}
	return res, nil
}

// probeFlow makes one connection as fl.UID and says where it landed. tells is
// false when the pod has no route to the target: a connection that cannot leave
// the pod escapes the proxy no more than it reaches it (an IPv6-only pod has no
// IPv4 route at all, though its capture has IPv4 rules), so, like a target the
// pod's settings do not capture, it is reported, not made, and does not decide
// the verdict.
func probeFlow(ctx context.Context, f probeFamily, fl Flow, src netip.Addr, o ProbeOptions, listeners []Listener) (_ Flow, tells bool) {
	target := netip.MustParseAddrPort(fl.Target)
	if routed, err := f.catcher.Routes(target.Addr()); err == nil && !routed {
		fl.Result = fmt.Sprintf("cannot tell: the pod has no route to %s (pass --outbound-target with an address it routes)", target)
		return fl, false
	}
	as := probe.Identity{UID: fl.UID, GID: fl.GID}
	if fl.NodeUID != nil {
		as = probe.Identity{UID: *fl.NodeUID, GID: *fl.NodeGID}
	}
	out, err := f.catcher.Send(ctx, probe.Conn{Target: target, Source: src, As: &as,
		Timeout: o.Timeout, Conntrack: true})
	if err != nil {
		fl.Result = "cannot probe: " + err.Error()
		var cred *probe.CredentialsError
		if errors.As(err, &cred) {
			fl.Result += " (in the agent pod: install with troubleshooting.enabled=true)"
		}
		return fl, true
	}
	held := func(port uint16) bool {
		for _, l := range listeners {
			if l.Port == port && l.Family == f.Name {
				return !l.Ours
			}
		}
		return false
	}
	if dialErr := out.DialErr; dialErr != nil {
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
		return fl, true
	}
	if a := out.Landed; a != nil {
		// Without a conntrack entry the connection went where it was sent: here.
		origDst := a.Local.String()
		if a.Err == nil {
			origDst = a.OriginalDst.String()
		}
		fl.LandedOn, fl.OriginalDst = a.Port, origDst
		switch {
		case a.Port == o.ProbePort && a.Port != fl.Want:
			fl.Result = fmt.Sprintf("NOT redirected: reached %s directly", target)
		case a.Port != fl.Want:
			fl.Result = fmt.Sprintf("NOT redirected as required: landed on port %d, not %d (original destination %s)", a.Port, fl.Want, origDst)
		case origDst != target.String():
			fl.Result = fmt.Sprintf("redirected to %d, but the original destination reads %s, not %s", a.Port, origDst, target)
		default:
			fl.Redirected = true
			fl.Result = fmt.Sprintf("redirected to %d (original destination preserved)", a.Port)
		}
		return fl, true
	}
	// Someone else accepted it: the proxy, when it holds the wanted port.
	switch answered := out.AnsweredBy; {
	case answered == fl.Want:
		fl.Redirected, fl.LandedOn = true, fl.Want
		fl.Result = fmt.Sprintf("redirected to %d (conntrack; the proxy's listener accepted it)", fl.Want)
	case answered == target.Port():
		fl.Result = fmt.Sprintf("NOT redirected: %s answered directly (conntrack)", target)
	case answered != 0:
		fl.LandedOn = answered
		fl.Result = fmt.Sprintf("NOT redirected as required: landed on port %d, not %d (conntrack)", answered, fl.Want)
	case held(fl.Want):
		fl.Redirected, fl.LandedOn = true, fl.Want
		fl.Result = fmt.Sprintf("connected, and accepted by the process holding port %d (conntrack could not confirm)", fl.Want)
	default:
		fl.Result = fmt.Sprintf("connected to %s, but none of the listeners saw it", target)
	}
	return fl, true
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
		ids := fmt.Sprintf("uid %d gid %d", f.UID, f.GID)
		if f.NodeUID != nil {
			ids += fmt.Sprintf(" (the node's %d and %d)", *f.NodeUID, *f.NodeGID)
		}
		fmt.Fprintf(&b, "%s %s, %s -> %s: %s\n", strings.SplitN(f.Name, " ", 2)[0], f.Family, ids, f.Target, f.Result)
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

// podIdentities maps the pod's uids and gids to the node's. Netfilter's owner match
// (and nftables' skuid and skgid) reads a socket's ids in the user namespace that
// owns the pod's network namespace: for a pod with hostUsers: false that is the
// pod's own, where the node's uid 1337 is not the proxy's 1337 (it is unmapped
// there). The probe must connect as the node's id that the pod's maps make the
// pod's. A pod in the node's user namespace needs no mapping; an owner that cannot
// be told (a kernel before 4.9) is taken as the node's, as the plugin takes it.
func podIdentities(nsPath, proc string) (*idMapping, error) {
	owner, err := netns.ForeignOwner(nsPath)
	if err != nil || owner < 0 {
		return &idMapping{}, nil
	}
	defer unix.Close(owner)
	if proc == "" {
		return nil, errors.New("the pod's network namespace belongs to a user namespace of its own (hostUsers: false), " +
			"and no process of the pod was found to read that namespace's uid and gid maps")
	}
	uid, gid, err := netns.ReadIDMaps(proc, owner)
	if err != nil {
		return nil, fmt.Errorf("the pod has a user namespace of its own (hostUsers: false): %w", err)
	}
	return &idMapping{foreign: true, uid: uid, gid: gid}, nil
}

// idMapping turns a pod's ids into the node's; the zero value is the identity.
type idMapping struct {
	foreign  bool
	uid, gid netns.IDMap
}

// toNode sets fl's NodeUID and NodeGID from its UID and GID.
func (m *idMapping) toNode(fl *Flow) error {
	if !m.foreign {
		return nil
	}
	u, ok := m.uid.Outside(fl.UID)
	if !ok {
		return fmt.Errorf("uid %d is not mapped in the pod's user namespace (uid_map %v)", fl.UID, m.uid)
	}
	g, ok := m.gid.Outside(fl.GID)
	if !ok {
		return fmt.Errorf("gid %d is not mapped in the pod's user namespace (gid_map %v)", fl.GID, m.gid)
	}
	fl.NodeUID, fl.NodeGID = &u, &g
	return nil
}
