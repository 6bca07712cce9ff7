package podcache_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/istio-cni/istio-cni/internal/podcache"

	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// TestPodsSockDropsAnIdleConnection: a peer that asked once on a kept-alive
// connection and then sends nothing is dropped after the socket's idle bound
// instead of holding a connection and a goroutine of the agent for ever; a request
// held for its whole wait (MaxWait) is still answered on the same kind of
// connection (the write bound exceeds the longest hold).
func TestPodsSockDropsAnIdleConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := podcache.New(fake.NewClientset(), "node-a", nil)
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	var c net.Conn
	for i := 0; ; i++ {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(path string) {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Held for the whole wait (no such pod), then answered (404, or 503 before
	// the informer listed: the answer does not matter, that it comes does).
	start := time.Now()
	ask("/v1/pods/default/absent?wait=" + strconv.FormatInt(podcache.MaxWait.Milliseconds(), 10))
	if took := time.Since(start); took < podcache.MaxWait {
		t.Errorf("the held request was answered after %s, want its whole wait (%s)", took, podcache.MaxWait)
	}

	// Then nothing: the server drops the connection within its idle bound.
	start = time.Now()
	_ = c.SetReadDeadline(time.Now().Add(podcache.IdleTimeout + 2*time.Second))
	_, err := r.ReadByte()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Errorf("pods.sock still holds an idle kept-alive connection after %s (IdleTimeout %s)", time.Since(start), podcache.IdleTimeout)
	case err == nil:
		t.Errorf("pods.sock sent a byte unasked on an idle connection")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}
