package capture_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/trace"
)

// The tracer (test/harness/trace) is the model the redirect tests reason with. This
// file holds it against the kernel: the same plans, the same connections, and where
// the tracer says each lands must be where the kernel delivers it.

// sandboxListener is one socket of the comparison. It answers with its name, NS:PORT,
// so the kernel's answer says where a connection landed.
type sandboxListener struct {
	ns    string // "pod" or "peer"
	proto string // "tcp" or "udp"
	// addr is the bound address; an unspecified one binds every address of its family.
	addr netip.Addr
	port uint16
	uid  int
}

func (l sandboxListener) name() string { return fmt.Sprintf("%s:%d", l.ns, l.port) }

// sandboxListeners are the sockets of trafficCases' flows: the capture ports, the
// app's, the tunnel and health ports, the peer's services, and the DNS agent and
// resolver.
func sandboxListeners() []sandboxListener {
	var ls []sandboxListener
	for _, unspec := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		for _, port := range []uint16{15001, 15006, 15008, 15021, 15053, 8080, 9090} {
			ls = append(ls, sandboxListener{ns: "pod", proto: "tcp", addr: unspec, port: port})
		}
		for _, port := range []uint16{80, 15020} {
			ls = append(ls, sandboxListener{ns: "peer", proto: "tcp", addr: unspec, port: port})
		}
	}
	// Like the Istio agent, the DNS listener binds localhost and runs as the proxy.
	return append(ls,
		sandboxListener{ns: "pod", proto: "udp", addr: netip.MustParseAddr("127.0.0.1"), port: 15053, uid: proxyUID},
		sandboxListener{ns: "peer", proto: "udp", addr: netip.IPv4Unspecified(), port: 53})
}

// TestTracerAgreesWithTheKernel sends trafficCases' connections through every
// backend in a real namespace pair, and asks the tracer where each one's first packet
// lands under the same plan: on which listener, with which original destination, or
// refused, or unanswered. A disagreement means the tracer's model of netfilter (or a
// backend) is wrong, and the redirect tests that reason with the tracer prove less
// than they say.
func TestTracerAgreesWithTheKernel(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	listeners := sandboxListeners()
	for bname, b := range backends(t) {
		for _, tc := range trafficCases {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				spec, err := tc.opts.Spec()
				if err != nil {
					t.Fatal(err)
				}
				plan := tc.opts.Plan(t)
				tp, err := sandbox.New(t.TempDir(), "")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tp.Close() })
				for _, l := range listeners {
					ns := tp.Pod
					if l.ns == "peer" {
						ns = tp.Peer
					}
					network := l.proto + "4"
					if l.addr.Is6() {
						network = l.proto + "6"
					}
					transparent := spec.Mode == redirect.ModeTProxy && l.ns == "pod" && l.port == spec.InboundCapturePort
					serveAs(t, ns, l.uid, l.name(), network, netip.AddrPortFrom(l.addr, l.port).String(), transparent)
				}
				if _, err := capture.Apply(ctx, tp.Pod, b, plan); err != nil {
					t.Fatal(err)
				}
				for _, f := range tc.flows {
					want, hops, err := traceFlow(plan, listeners, f)
					if err != nil {
						t.Fatalf("%s: %v", f.name, err)
					}
					answer := send(t, tp, f)
					if got := kernelLanding(answer); got != want {
						t.Errorf("%s: %s %s from %s\ntracer: lands %q\n  %s\nkernel: %q",
							f.name, f.proto, f.dst, f.from, want, strings.Join(hops, "\n  "), answer)
					}
				}
			})
		}
	}
}

// kernelLanding reduces a probe's answer to where the connection landed: the
// listener's answer, "refused", or "no answer".
func kernelLanding(answer string) string {
	switch {
	case !strings.HasPrefix(answer, "error:"):
		return answer
	case strings.Contains(answer, "connection refused"):
		return "refused"
	}
	return "no answer"
}

// traceFlow asks the tracer where flow f's first packet lands in the sandbox under
// plan, in the words of kernelLanding. hops are the packets it traced, each with its
// verdict. The tracer decides one hook; this follows the packet between hooks as the
// sandbox routes it: a locally generated packet for a local address (or redirected to
// one) comes back in through lo and PREROUTING, carrying its marks and its
// connection's NAT; an arriving or looped-back packet that is not dropped reaches the
// socket bound to its (possibly new) destination.
func traceFlow(plan *redirect.Plan, listeners []sandboxListener, f flow) (landing string, hops []string, err error) {
	proto := redirect.TCP
	if strings.HasPrefix(f.proto, "udp") {
		proto = redirect.UDP
	}
	// The source port is the client's ephemeral one: no plan matches it.
	pkt := trace.Packet{Proto: proto, Dst: f.dst.Addr(), SrcPort: 40000, DstPort: f.dst.Port()}
	if f.from == "peer" {
		pkt.Direction, pkt.InIface, pkt.Src = trace.Inbound, "eth0", sandboxAddr(f.dst.Addr(), sandbox.PeerV4, sandbox.PeerV6)
	} else {
		uid := uint32(appUID)
		if f.from == "proxy" {
			uid = proxyUID
		}
		pkt.Direction, pkt.UID, pkt.GID = trace.Outbound, uid, uid
		pkt.Src, pkt.OutIface = sandboxAddr(f.dst.Addr(), podV4, podV6), "eth0"
		if local(f.dst.Addr()) {
			pkt.OutIface = "lo"
			if f.dst.Addr().IsLoopback() {
				pkt.Src = f.dst.Addr()
			}
		}
	}
	deliver := func(ns string, dst netip.AddrPort) string {
		i := slices.IndexFunc(listeners, func(l sandboxListener) bool {
			return l.ns == ns && l.proto == string(proto) && l.port == dst.Port() &&
				(l.addr == dst.Addr() || l.addr.IsUnspecified() && l.addr.Is4() == dst.Addr().Is4())
		})
		switch {
		case i < 0:
			return "refused"
		case proto == redirect.UDP:
			return listeners[i].name()
		}
		// What the listener reads: SO_ORIGINAL_DST after NAT, its own address after
		// TPROXY or none: the address the client dialled, either way.
		return listeners[i].name() + " " + f.dst.String()
	}
	for {
		v, err := trace.Trace(plan, pkt)
		if err != nil {
			return "", hops, err
		}
		hops = append(hops, strings.ReplaceAll(fmt.Sprintf("%s: %s", pkt, v), "\n", "\n  "))
		dst := netip.AddrPortFrom(pkt.Dst, pkt.DstPort)
		switch v.Action {
		case trace.Dropped:
			return "no answer", hops, nil
		case trace.TProxied:
			// The packet keeps its destination and goes to the socket on the port.
			return deliver("pod", netip.AddrPortFrom(dst.Addr(), v.Port)), hops, nil
		case trace.Redirected:
			// REDIRECT rewrites the destination to a local address: loopback for a
			// locally generated packet, the pod's own address for an arriving one.
			if pkt.Direction == trace.Inbound {
				return deliver("pod", netip.AddrPortFrom(sandboxAddr(dst.Addr(), podV4, podV6), v.Port)), hops, nil
			}
			dst = netip.AddrPortFrom(sandboxAddr(dst.Addr(), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()), v.Port)
		case trace.Passed:
			switch {
			case pkt.Direction == trace.Inbound:
				return deliver("pod", dst), hops, nil
			case pkt.OutIface != "lo":
				if dst.Addr() == sandbox.PeerV4 || dst.Addr() == sandbox.PeerV6 {
					return deliver("peer", dst), hops, nil
				}
				return "no answer", hops, nil // the peer does not forward
			}
		}
		// Looped back through lo: PREROUTING sees the packet again, NATed, with the
		// marks OUTPUT gave it.
		pkt = trace.Packet{Direction: trace.Inbound, InIface: "lo", Proto: proto,
			Src: pkt.Src, SrcPort: pkt.SrcPort, Dst: dst.Addr(), DstPort: dst.Port(), Mark: v.Mark, ConnMark: v.ConnMark}
	}
}

// local reports whether the pod's routes deliver a to the pod itself, through lo.
func local(a netip.Addr) bool { return a.IsLoopback() || a == podV4 || a == podV6 }

// sandboxAddr returns v4 or v6, whichever is of a's family.
func sandboxAddr(a, v4, v6 netip.Addr) netip.Addr {
	if a.Is4() {
		return v4
	}
	return v6
}
