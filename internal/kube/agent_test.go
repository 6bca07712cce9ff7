package kube

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/silent"
)

// listen serves h on a unix socket in a temp dir and returns its path.
func listen(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "pods.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestAgentClientReadsAPodAndSaysNotFound(t *testing.T) {
	sock := listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/pods/ns-a/pod-a" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"metadata":{"namespace":"ns-a","name":"pod-a","uid":"u1"}}`))
	}))
	c := NewAgentClient(sock, time.Second)
	pod, err := c.GetPod(context.Background(), "ns-a", "pod-a")
	if err != nil || pod.Metadata.UID != "u1" {
		t.Fatalf("GetPod = %+v, %v; want the pod with uid u1", pod, err)
	}
	if _, err := c.GetPod(context.Background(), "ns-a", "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetPod of a pod the cache lacks: %v, want ErrNotFound", err)
	}
}

// TestAgentClientGivesUpOnAHungAgent: an agent that accepts the connection and never
// answers costs the plugin the timeout, not more.
func TestAgentClientGivesUpOnAHungAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pods.sock")
	silent.Listen(t, "unix", sock)
	start := time.Now()
	_, err := NewAgentClient(sock, 100*time.Millisecond).GetPod(context.Background(), "ns", "p")
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("GetPod from a hung agent: err=%v after %s; want an error after about 100ms", err, took)
	}
}

// TestAgentClientCutsALongErrorAnswer: an error answer is quoted in the error by its
// first bytes and its length, not echoed whole.
func TestAgentClientCutsALongErrorAnswer(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	sock := listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, long, http.StatusInternalServerError)
	}))
	_, err := NewAgentClient(sock, time.Second).GetPod(context.Background(), "ns", "p")
	if err == nil || !strings.Contains(err.Error(), "answered 500") || !strings.Contains(err.Error(), "bytes)") || len(err.Error()) > 200 {
		t.Fatalf("GetPod from an agent answering 500 with %d bytes: %v; want a short error naming the status and the length", len(long), err)
	}
}
