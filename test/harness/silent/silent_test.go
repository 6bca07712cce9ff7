package silent

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/poll"
)

// A client connects, and its read gets nothing until its own deadline.
func TestServerAcceptsAndNeverAnswers(t *testing.T) {
	s := Listen(t, "tcp", "127.0.0.1:0")
	if s.Accepted() {
		t.Fatal("Accepted before any client connected")
	}
	c, err := net.Dial(s.Addr.Network(), s.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from the silent server: %d bytes, %v; want the deadline", n, err)
	}
	poll.Until(t, time.Second, 10*time.Millisecond, "the server has accepted the client", s.Accepted)
}

// An echo server behind the proxy answers through it until Stall; then neither a
// connection made before nor one made after gets anything, and neither is closed.
func TestProxyForwardsUntilStalled(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := StallingProxy(t, echo.Addr().String())
	roundTrip := func(c net.Conn) error {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		return err
	}
	before, err := net.Dial("tcp", p.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	if err := roundTrip(before); err != nil {
		t.Fatalf("through the proxy before Stall: %v", err)
	}
	p.Stall()
	if err := roundTrip(before); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection made before Stall: %v, want no answer until the deadline", err)
	}
	after, err := net.Dial("tcp", p.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if err := roundTrip(after); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection made after Stall: %v, want no answer until the deadline", err)
	}
}
