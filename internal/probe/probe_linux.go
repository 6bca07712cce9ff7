package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Family is what probing needs to know of one IP family.
type Family struct {
	// Name is how reports name the family: "ipv4" or "ipv6".
	Name string
	// Network is the Go network of its sockets: "tcp4" or "tcp6".
	Network string
	// Wildcard is the address the listeners listen on.
	Wildcard netip.Addr
	// Loopback is the source the validation probe binds, as Istio's does, so that
	// the capture's inbound passthrough rule (which matches its source) cannot let
	// the probe through.
	Loopback netip.Addr
	// Passthrough is Istio's inbound passthrough address: the validation probe's
	// destination.
	Passthrough netip.Addr
}

// The two families.
var (
	IPv4 = Family{"ipv4", "tcp4", netip.IPv4Unspecified(), netip.MustParseAddr("127.0.0.1"), redirect.InboundPassthroughV4.Addr()}
	IPv6 = Family{"ipv6", "tcp6", netip.IPv6Unspecified(), netip.IPv6Loopback(), redirect.InboundPassthroughV6.Addr()}
)

// Families returns the families a pod's capture covers: IPv4, and IPv6 with ipv6.
func Families(ipv6 bool) []Family {
	if ipv6 {
		return []Family{IPv4, IPv6}
	}
	return []Family{IPv4}
}

// Catcher listens, in one network namespace and one family, on the ports a probe
// connection may land on, and tells which of them accepted each connection it sends.
type Catcher struct {
	ns        string
	family    Family
	landed    chan Landing
	listeners []net.Listener
}

// Landing is a connection one of a Catcher's listeners accepted.
type Landing struct {
	// Port is the listener's port.
	Port uint16
	// Peer is the connection's source; Local the address it was accepted on.
	Peer, Local netip.AddrPort
	// OriginalDst is the connection's destination before NAT (see OriginalDst);
	// Err says why it could not be read.
	OriginalDst netip.AddrPort
	Err         error
}

// NewCatcher returns a Catcher for family in the network namespace at nsPath. With
// nsPath "" it works in the calling goroutine's own namespace, so that a caller
// already inside netns.Do can use it.
func NewCatcher(nsPath string, family Family) *Catcher {
	// Connections nobody waits for are dropped once it is full.
	return &Catcher{ns: nsPath, family: family, landed: make(chan Landing, 64)}
}

// in runs fn in the catcher's namespace on a locked thread: the namespace, and the
// file credentials Send sets, belong to the thread.
func (c *Catcher) in(fn func() error) error {
	if c.ns == "" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		return fn()
	}
	return netns.Do(c.ns, fn)
}

// Listen listens on port at the family's wildcard address. The error is the
// listen's own, which names the address; it wraps unix.EADDRINUSE when another
// process (a proxy) holds the port.
func (c *Catcher) Listen(ctx context.Context, port uint16) error {
	addr := netip.AddrPortFrom(c.family.Wildcard, port)
	var ln net.Listener
	err := c.in(func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, c.family.Network, addr.String())
		return err
	})
	if err != nil {
		return err
	}
	c.listeners = append(c.listeners, ln)
	go c.accept(ln.(*net.TCPListener), port)
	return nil
}

func (c *Catcher) accept(ln *net.TCPListener, port uint16) {
	for {
		conn, err := ln.AcceptTCP()
		if err != nil {
			return // closed
		}
		l := Landing{Port: port, Peer: conn.RemoteAddr().(*net.TCPAddr).AddrPort(), Local: conn.LocalAddr().(*net.TCPAddr).AddrPort()}
		l.OriginalDst, l.Err = OriginalDst(conn)
		conn.Close()
		select {
		case c.landed <- l:
		default:
		}
	}
}

// Close stops the listeners.
func (c *Catcher) Close() {
	for _, ln := range c.listeners {
		ln.Close()
	}
	c.listeners = nil
}

// Identity is a uid and gid a probe connection is made as.
type Identity struct {
	UID, GID uint32
}

// Conn is one probe connection.
type Conn struct {
	Target netip.AddrPort
	// Source is the address the connection binds; invalid: the kernel's choice.
	Source netip.Addr
	// As is who makes the connection, as netfilter's owner match sees it; nil:
	// this process's own credentials.
	As *Identity
	// Timeout bounds the connect, then the wait for a listener to accept it.
	Timeout time.Duration
	// Conntrack asks for the port that answered according to the connection's
	// conntrack entry: how to tell where a connection went that another process
	// accepted.
	Conntrack bool
}

// Outcome is what became of a probe connection.
type Outcome struct {
	// DialErr is why the connection failed (refused, timed out, unreachable); the
	// rest is empty then.
	DialErr error
	// Local is the connection's own address.
	Local netip.AddrPort
	// Landed is the catcher's listener that accepted it; nil when none did within
	// the timeout.
	Landed *Landing
	// AnsweredBy is, with Conn.Conntrack, the port that answered the connection
	// according to the reply direction of its conntrack entry; 0 when conntrack
	// could not be read (no nf_conntrack_netlink) or had no entry.
	AnsweredBy uint16
}

// CredentialsError is a probe that could not take on its Identity: the process
// lacks CAP_SETUID or CAP_SETGID, and the kernel silently keeps its own.
type CredentialsError struct {
	// What is "uid" or "gid".
	What       string
	Want, Stay int
}

func (e *CredentialsError) Error() string {
	return fmt.Sprintf("cannot connect as %s %d (the fs%s stays %d): this process lacks CAP_SET%s", e.What, e.Want, e.What, e.Stay, strings.ToUpper(e.What))
}

// Routes says whether the catcher's namespace has a route to dst. Without one a
// connection to dst fails before anything leaves, whether or not it is captured
// (an IPv6-only pod has no IPv4 route at all).
func (c *Catcher) Routes(dst netip.Addr) (bool, error) {
	routed := false
	err := c.in(func() error {
		_, err := netlink.RouteGet(dst.AsSlice())
		switch {
		case err == nil:
			routed = true
		case errors.Is(err, unix.ENETUNREACH), errors.Is(err, unix.EHOSTUNREACH):
		default:
			return fmt.Errorf("route to %s: %w", dst, err)
		}
		return nil
	})
	return routed, err
}

// Send makes the connection in the catcher's namespace, closes it, and waits for one
// of the catcher's listeners to accept it. Its error is for what prevents probing
// (the namespace, the identity, ctx); a connection that fails is an Outcome.
func (c *Catcher) Send(ctx context.Context, conn Conn) (Outcome, error) {
	var out Outcome
	err := c.in(func() error {
		if conn.As != nil {
			restore, err := becomeFS(*conn.As)
			defer restore()
			if err != nil {
				return err
			}
		}
		d := net.Dialer{Timeout: conn.Timeout}
		if conn.Source.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(conn.Source, 0))
		}
		nc, err := d.DialContext(ctx, c.family.Network, conn.Target.String())
		if err != nil {
			out.DialErr = err
			return nil
		}
		out.Local = nc.LocalAddr().(*net.TCPAddr).AddrPort()
		nc.Close()
		if conn.Conntrack {
			out.AnsweredBy = answeredBy(c.family, out.Local, conn.Target)
		}
		return nil
	})
	if err != nil || out.DialErr != nil {
		return out, err
	}
	wait := time.NewTimer(conn.Timeout)
	defer wait.Stop()
	for {
		select {
		case l := <-c.landed:
			if l.Peer.Addr().Unmap() != out.Local.Addr().Unmap() || l.Peer.Port() != out.Local.Port() {
				continue // an earlier connection's straggler, or someone else's
			}
			out.Landed = &l
			return out, nil
		case <-wait.C:
			return out, nil
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
}

// becomeFS makes the current thread's file credentials id's: netfilter's owner
// match reads a socket's from the thread that created it. restore puts the
// previous ones back; it is never nil.
func becomeFS(id Identity) (restore func(), err error) {
	// setfs[ug]id(-1) changes nothing and returns the current value.
	prevUID, _ := unix.SetfsuidRetUid(-1)
	prevGID, _ := unix.SetfsgidRetGid(-1)
	restore = func() {
		unix.Setfsuid(prevUID)
		unix.Setfsgid(prevGID)
	}
	unix.Setfsgid(int(id.GID))
	unix.Setfsuid(int(id.UID))
	// setfsuid(2) reports no error: without the capability the thread stays who it
	// was, and the probe would test that identity's traffic instead.
	if uid, _ := unix.SetfsuidRetUid(-1); uid != int(id.UID) {
		return restore, &CredentialsError{What: "uid", Want: int(id.UID), Stay: uid}
	}
	if gid, _ := unix.SetfsgidRetGid(-1); gid != int(id.GID) {
		return restore, &CredentialsError{What: "gid", Want: int(id.GID), Stay: gid}
	}
	return restore, nil
}

// answeredBy finds the connection's conntrack entry in the current namespace; its
// reply tuple names the port that really answered. 0 when there is none to read.
func answeredBy(f Family, local, target netip.AddrPort) uint16 {
	fam := netlink.FAMILY_V4
	if f.Network == "tcp6" {
		fam = netlink.FAMILY_V6
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(fam))
	if err != nil {
		return 0
	}
	for _, fl := range flows {
		dst, _ := netip.AddrFromSlice(fl.Forward.DstIP)
		if fl.Forward.Protocol == unix.IPPROTO_TCP && fl.Forward.SrcPort == local.Port() &&
			fl.Forward.DstPort == target.Port() && dst.Unmap() == target.Addr().Unmap() {
			return fl.Reverse.SrcPort
		}
	}
	return 0
}
