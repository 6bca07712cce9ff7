package silent

import (
	"errors"
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
