package unixsock

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// DrainListener is a unix stream or seqpacket listener (Listen) that can stop
// accepting without dropping the connections already in its listen queue: a peer's
// connect succeeds as soon as the kernel queues it, and a plugin has sent its
// records on it by then, which closing the listener would throw away.
type DrainListener struct {
	*net.UnixListener
	draining atomic.Bool
}

// NewDrainListener wraps l.
func NewDrainListener(l *net.UnixListener) *DrainListener { return &DrainListener{UnixListener: l} }

// Drain makes Accept hand out the connections queued now without waiting for more,
// then return net.ErrClosed; an Accept blocked meanwhile wakes to do so. Peers
// can still connect while the socket's path names it: a caller that wants the
// queue to end removes the path first. The listener stays open until Close.
func (l *DrainListener) Drain() {
	l.draining.Store(true)
	_ = l.UnixListener.SetDeadline(time.Unix(1, 0)) // a past deadline wakes a blocked Accept
}

// Accept waits for the next connection, as net.UnixListener's does, until Drain.
func (l *DrainListener) Accept() (net.Conn, error) {
	if !l.draining.Load() {
		c, err := l.UnixListener.Accept()
		if err == nil || !l.draining.Load() {
			return c, err
		}
		// Woken by Drain's deadline.
	}
	return l.acceptQueued()
}

// acceptQueued accepts a connection in the queue without waiting (the listener's
// descriptor is non-blocking, as every socket of Go's); net.ErrClosed when the
// queue is empty.
func (l *DrainListener) acceptQueued() (net.Conn, error) {
	raw, err := l.UnixListener.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd, aerr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		for {
			nfd, _, aerr = syscall.Accept4(int(fd), syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK)
			if aerr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return nil, err
	}
	switch {
	case errors.Is(aerr, syscall.EAGAIN):
		return nil, net.ErrClosed
	case aerr != nil:
		// As net's Accept words it: EMFILE and ENFILE are Temporary, which the
		// callers' accept loops wait out.
		return nil, &net.OpError{Op: "accept", Net: l.Addr().Network(), Addr: l.Addr(), Err: os.NewSyscallError("accept4", aerr)}
	}
	f := os.NewFile(uintptr(nfd), "")
	defer f.Close() // net.FileConn holds a duplicate
	return net.FileConn(f)
}

// DrainDatagrams hands each datagram queued on c now to record, without waiting
// for more, and returns how many there were. buf bounds one datagram, as for a
// read; a longer one is cut (n > len(buf) tells it).
func DrainDatagrams(c *net.UnixConn, buf []byte, record func(b []byte, n int)) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	count := 0
	for {
		n, rerr := -1, error(nil)
		if err := raw.Control(func(fd uintptr) {
			for {
				// MSG_TRUNC: the datagram's whole length, as a read's n past buf.
				n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT|syscall.MSG_TRUNC)
				if rerr != syscall.EINTR {
					return
				}
			}
		}); err != nil {
			return count, err
		}
		switch {
		case errors.Is(rerr, syscall.EAGAIN):
			return count, nil
		case rerr != nil:
			return count, os.NewSyscallError("recvfrom", rerr)
		}
		count++
		record(buf[:min(n, len(buf))], n)
	}
}
