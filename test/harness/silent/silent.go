// Package silent is the tests' server that accepts connections and never answers:
// the worst case for a client (no quick refusal, no reply, no close), to prove
// that its timeouts hold.
package silent

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Server holds every connection it accepts open, unread and unanswered, until the
// test ends.
type Server struct {
	// Addr is the address it listens on.
	Addr     net.Addr
	accepted atomic.Bool
}

// Listen starts a silent server on network and address (as net.Listen takes them);
// t's cleanup closes the listener and every connection it holds.
func Listen(t testing.TB, network, address string) *Server {
	t.Helper()
	ln, err := net.Listen(network, address)
	if err != nil {
		t.Fatalf("silent server: %v", err)
	}
	s := &Server{Addr: ln.Addr()}
	var held []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener is closed
			}
			s.accepted.Store(true)
			held = append(held, c)
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range held {
			c.Close()
		}
	})
	return s
}

// Accepted says whether a client has connected so far.
func (s *Server) Accepted() bool { return s.accepted.Load() }
