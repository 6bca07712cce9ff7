package nftables

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// ReplyBound bounds each wait for the kernel's netlink answer (a batch's acks, one
// datagram of a dump). The kernel answers nftables requests while it handles the
// send, so a wait this long means a kernel that does not answer; the command then
// fails naming the bound instead of hanging the pod's ADD.
const ReplyBound = 5 * time.Second

// replyBufSize is the read buffer of the netlink socket. The kernel cuts a dump
// into datagrams of at most 32 KiB (netlink_dump's allocation cap) and an ack is
// far smaller, so a datagram that does not fit is refused as malformed.
const replyBufSize = 64 << 10

// conn is a google/nftables connection over a blocking netlink socket of the
// calling thread's network namespace. Close closes both.
type conn struct {
	*gnft.Conn
	sock *blockingSocket
}

// Close releases the library's connection and the socket.
func (c *conn) Close() {
	_ = c.CloseLasting()
	c.sock.close()
}

// Flush sends the queued batch and waits for its acks, as the library's Flush,
// with its error collapsed (collapseRepeats): a batch refused before the kernel
// read it (a failed send) fails every one of its messages' acks the same way,
// and the library joins them all, thousands of identical lines for a large plan.
func (c *conn) Flush() error { return collapseRepeats(c.Conn.Flush()) }

// collapseRepeats returns err with the errors it joins (errors.Join, nested as
// the library joins one ack's error at a time, under any %w wrapping) that read
// the same kept once, each followed by how many times it occurred. errors.Is and
// errors.As still see every distinct error.
func collapseRepeats(err error) error {
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		var leaves []error
		flattenJoined(e, &leaves)
		r := &repeatedErrors{}
		index := map[string]int{}
		for _, x := range leaves {
			x = collapseRepeats(x)
			text := x.Error()
			if i, ok := index[text]; ok {
				r.counts[i]++
				continue
			}
			index[text] = len(r.errs)
			r.errs = append(r.errs, x)
			r.counts = append(r.counts, 1)
		}
		if len(r.errs) == len(leaves) && len(leaves) == len(e.Unwrap()) {
			return err
		}
		return r
	case interface{ Unwrap() error }:
		inner := e.Unwrap()
		collapsed := collapseRepeats(inner)
		if collapsed == inner {
			return err
		}
		// Keep the wrapper's own words around the inner error's shorter text.
		text := strings.Replace(err.Error(), inner.Error(), collapsed.Error(), 1)
		return &wrapped{text: text, err: collapsed, orig: err}
	}
	return err
}

// flattenJoined appends the errors that e joins to leaves, those that join
// errors themselves expanded in turn.
func flattenJoined(e interface{ Unwrap() []error }, leaves *[]error) {
	for _, x := range e.Unwrap() {
		if j, ok := x.(interface{ Unwrap() []error }); ok {
			flattenJoined(j, leaves)
			continue
		}
		*leaves = append(*leaves, x)
	}
}

// repeatedErrors is a joined error whose repeats were counted instead of listed.
type repeatedErrors struct {
	errs   []error
	counts []int
}

func (r *repeatedErrors) Error() string {
	var b strings.Builder
	for i, e := range r.errs {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
		if r.counts[i] > 1 {
			fmt.Fprintf(&b, " (%d times)", r.counts[i])
		}
	}
	return b.String()
}

func (r *repeatedErrors) Unwrap() []error { return r.errs }

// wrapped is a %w wrapper whose inner error was collapsed: its text with the
// collapsed inner text, the collapsed inner error, and the original wrapper for
// errors.As on its type.
type wrapped struct {
	text string
	err  error
	orig error
}

func (w *wrapped) Error() string   { return w.text }
func (w *wrapped) Unwrap() []error { return []error{w.err, w.orig} }

// dialHere opens a netlink socket in the network namespace of the calling thread
// (the caller holds it there, see netns.Do). The socket is created synchronously
// on this thread, so no helper goroutine has to enter the namespace, and its
// namespace is fixed for its life whatever thread later reads from it.
//
// The library's own transport (mdlayher/socket) starts a goroutine for every send
// and receive to watch a context it is never given; on a thread locked into a
// pod's namespace each of those costs thread hand-offs, about a third of an ADD's
// nftables time on 2 cores. blockingSocket makes the plain system calls on the
// calling thread instead; the library takes another transport only through
// WithTestDial, whose socket hands each send and each receive to a function.
func dialHere() (*conn, error) {
	s, err := openBlockingSocket()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	c, err := gnft.New(gnft.AsLasting(), gnft.WithTestDial(s.exchange))
	if err != nil {
		s.close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &conn{Conn: c, sock: s}, nil
}

// blockingSocket is a NETLINK_NETFILTER socket used with blocking system calls,
// each wait bounded by ReplyBound.
type blockingSocket struct {
	fd    int
	port  uint32        // the kernel-assigned port id (nl_pid) of the socket
	bound time.Duration // each wait's bound: ReplyBound (tests shorten it)
	buf   []byte
	// fitted: the send buffer was sized for a batch (fitSendBuffer).
	fitted bool
}

func openBlockingSocket() (*blockingSocket, error) { return openBlockingSocketBounded(ReplyBound) }

func openBlockingSocketBounded(bound time.Duration) (*blockingSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	s := &blockingSocket{fd: fd, bound: bound}
	if err := s.init(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *blockingSocket) init() error {
	tv := unix.NsecToTimeval(s.bound.Nanoseconds())
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return os.NewSyscallError("setsockopt", err)
		}
	}
	if err := unix.Bind(s.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("bind", err)
	}
	sa, err := unix.Getsockname(s.fd)
	if err != nil {
		return os.NewSyscallError("getsockname", err)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		return fmt.Errorf("getsockname: %T is not a netlink address", sa)
	}
	s.port = nl.Pid
	s.buf = make([]byte, replyBufSize)
	return nil
}

func (s *blockingSocket) close() {
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// exchange is the nltest.Func of the library's connection: messages to send (one
// datagram, as the library's own transport sends a batch), or nil to receive one
// datagram. The connection stamps requests with nltest.PID and checks that
// replies carry it; the kernel addresses the socket by its real port id, so the
// two are swapped here, both ways.
func (s *blockingSocket) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if req == nil {
		return s.receive()
	}
	var b []byte
	for _, m := range req {
		if m.Header.PID == nltest.PID {
			m.Header.PID = s.port
		}
		// The library asks the kernel to echo every rule it adds, and reads the
		// echo only to throw it away (its Flush keeps no handle): without the
		// flag, the kernel neither builds nor sends a copy of each rule, and each
		// rule's answer is its ack alone, one receive instead of two.
		m.Header.Flags &^= unix.NLM_F_ECHO
		mb, err := m.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("netlink: marshal: %w", err)
		}
		b = append(b, mb...)
	}
	if len(b) > smallBatch {
		if err := s.fitSendBuffer(len(b)); err != nil {
			return nil, err
		}
	}
	send := func() error {
		return s.retry("sendmsg", func() error {
			return unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		})
	}
	err := send()
	if errors.Is(err, unix.EMSGSIZE) && !s.fitted {
		// A node whose default send buffer is below smallBatch.
		if ferr := s.fitSendBuffer(len(b)); ferr != nil {
			return nil, errors.Join(err, ferr)
		}
		err = send()
	}
	if errors.Is(err, unix.EMSGSIZE) {
		return nil, fmt.Errorf("netlink: a batch of %d bytes does not fit the socket's send buffer: %w", len(b), err)
	}
	return nil, err
}

// smallBatch is the largest batch sent without looking at the socket's send
// buffer: the kernel refuses (EMSGSIZE) a netlink message larger than the buffer,
// whose default (net.core.wmem_default) is 208 KiB on stock kernels. A pod's
// batch is a few KiB (the richest of the test cases, 33 KiB), so its send costs
// no extra system call; only a large plan's (hundreds of CIDRs or interfaces)
// pays the look and the raise. On a node whose default is below this, the
// refused send is what makes exchange size the buffer and send again.
const smallBatch = 128 << 10

// fitSendBuffer makes the socket's send buffer hold a batch of n bytes, raising
// it past the node's maximum with SO_SNDBUFFORCE (CAP_NET_ADMIN, which the
// plugin has) or else with SO_SNDBUF, up to that maximum (net.core.wmem_max):
// what nft does for a large ruleset.
func (s *blockingSocket) fitSendBuffer(n int) error {
	s.fitted = true
	cur, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		return os.NewSyscallError("getsockopt SO_SNDBUF", err)
	}
	// The kernel keeps 32 bytes of the buffer for itself and doubles what is
	// asked for, for its bookkeeping; asking for n plus a page leaves room.
	if n+netlinkSendOverhead <= cur {
		return nil
	}
	want := n + os.Getpagesize()
	if err := setBuffer(s.fd, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, want); err != nil {
		return fmt.Errorf("netlink: raise the send buffer to %d bytes for a %d-byte batch: %w", want, n, err)
	}
	if got, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF); err == nil && n+netlinkSendOverhead > got {
		return fmt.Errorf("netlink: a batch of %d bytes exceeds the socket's send buffer (%d bytes, the most net.core.wmem_max allows without CAP_NET_ADMIN)", n, got)
	}
	return nil
}

// netlinkSendOverhead is what netlink_sendmsg keeps of the send buffer: a
// message must be at most the buffer less these bytes.
const netlinkSendOverhead = 32

// setBuffer sets a socket buffer with the forcing option, or where that is not
// permitted, the plain one (capped by the node's maximum).
func setBuffer(fd, force, plain, size int) error {
	err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size)
	if errors.Is(err, unix.EPERM) {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size)
	}
	if err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	return nil
}

func (s *blockingSocket) receive() ([]netlink.Message, error) {
	var n int
	err := s.retry("recvmsg", func() error {
		var err error
		// MSG_TRUNC: a netlink socket then returns the datagram's real length.
		n, _, err = unix.Recvfrom(s.fd, s.buf, unix.MSG_TRUNC)
		return err
	})
	if err != nil {
		return nil, err
	}
	if n > len(s.buf) {
		return nil, fmt.Errorf("netlink: a reply of %d bytes exceeds the %d-byte buffer", n, len(s.buf))
	}
	// The library keeps messages across receives (a dump's parts): copy them out
	// of the reused buffer.
	raw, err := syscall.ParseNetlinkMessage(append([]byte(nil), s.buf[:n]...))
	if err != nil {
		return nil, fmt.Errorf("netlink: parse reply: %w", err)
	}
	msgs := make([]netlink.Message, 0, len(raw))
	for _, r := range raw {
		h := netlink.Header{Length: r.Header.Len, Type: netlink.HeaderType(r.Header.Type),
			Flags: netlink.HeaderFlags(r.Header.Flags), Sequence: r.Header.Seq, PID: r.Header.Pid}
		if h.PID == s.port {
			h.PID = nltest.PID
		}
		msgs = append(msgs, netlink.Message{Header: h, Data: r.Data})
	}
	return msgs, nil
}

// retry runs a blocking call again when a signal interrupted it (a call under a
// socket timeout fails with EINTR whatever SA_RESTART says, and the Go runtime
// signals its threads), until the bound has passed; a timeout is reported with
// the bound.
func (s *blockingSocket) retry(op string, call func() error) error {
	deadline := time.Now().Add(s.bound)
	for {
		err := call()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR) && time.Now().Before(deadline):
			continue
		case errors.Is(err, unix.EAGAIN):
			return fmt.Errorf("netlink: no answer from the kernel within %v: %w", s.bound, os.NewSyscallError(op, err))
		}
		return os.NewSyscallError(op, err)
	}
}

// Conn is the connection DialHere returns: google/nftables over a blocking netlink
// socket of the calling thread's network namespace. Close closes both.
type Conn = conn

// DialHere opens a connection in the calling thread's network namespace for other
// writers of nftables objects (the iptables backend writes iptables-nft's rules
// with it); see dialHere.
func DialHere() (*Conn, error) { return dialHere() }
