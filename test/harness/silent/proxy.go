package silent

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to an upstream address until Stall is called;
// from then on it forwards nothing more, either way, on the connections it holds
// and on new ones, and closes none of them: a server that stops answering in the
// middle of a run, after its clients have connected and been answered.
type Proxy struct {
	// Addr is the address it listens on.
	Addr    net.Addr
	stalled chan struct{}
	stall   sync.Once
}

// StallingProxy starts a Proxy to upstream (host:port) on 127.0.0.1; t's cleanup
// closes the listener and every connection.
func StallingProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("stalling proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr(), stalled: make(chan struct{})}
	ended := make(chan struct{})
	var mu sync.Mutex
	var held []net.Conn
	closed := false // under mu: the cleanup closed held; a later connection is closed at once
	hold := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			c.Close()
			return
		}
		held = append(held, c)
	}
	var wg sync.WaitGroup
	// pipe copies from src to dst until src fails or the proxy stalls, and then
	// holds what it has read.
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-p.stalled:
				<-ended
				return
			default:
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				dst.Close()
				return
			}
		}
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener is closed
			}
			hold(c)
			select {
			case <-p.stalled:
				continue
			default:
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			hold(up)
			wg.Go(func() { pipe(up, c) })
			wg.Go(func() { pipe(c, up) })
		}
	})
	t.Cleanup(func() {
		close(ended)
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// Stall stops all forwarding, for good.
func (p *Proxy) Stall() { p.stall.Do(func() { close(p.stalled) }) }
