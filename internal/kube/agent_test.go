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

	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// listen serves h on a unix socket in a temp dir and returns its path.
func listen(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(shortdir.New(t), "pods.sock")
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
	pod, err := c.GetPod(context.Background(), "ns-a", "pod-a", "", 0)
	if err != nil || pod.Metadata.UID != "u1" {
		t.Fatalf("GetPod = %+v, %v; want the pod with uid u1", pod, err)
	}
	if _, err := c.GetPod(context.Background(), "ns-a", "other", "", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetPod of a pod the cache lacks: %v, want ErrNotFound", err)
	}
}

// TestAgentClientAsksTheAgentToWait: a wait is sent as whole milliseconds with the
// sandbox's uid, and the request's bound grows by it: an agent that answers after
// 150 ms is waited for with a 100 ms bound and a 100 ms wait, and not without the
// wait. Without a wait the request carries no parameters.
func TestAgentClientAsksTheAgentToWait(t *testing.T) {
	queries := make(chan string, 10)
	sock := listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries <- r.URL.RawQuery
		if r.URL.Query().Get("uid") == "slow" {
			time.Sleep(150 * time.Millisecond)
		}
		w.Write([]byte(`{"metadata":{"namespace":"ns","name":"p","uid":"u1"}}`))
	}))
	c := NewAgentClient(sock, 100*time.Millisecond)
	cases := []struct {
		uid       string
		wait      time.Duration
		wantQuery string
		wantErr   bool
	}{
		{uid: "u1", wait: 0, wantQuery: ""},
		{uid: "", wait: 20 * time.Millisecond, wantQuery: "wait=20"},
		{uid: "u1", wait: 100 * time.Millisecond, wantQuery: "uid=u1&wait=100"},
		{uid: "slow", wait: 100 * time.Millisecond, wantQuery: "uid=slow&wait=100"},
		{uid: "slow", wait: time.Millisecond, wantQuery: "uid=slow&wait=1", wantErr: true},
	}
	for _, tc := range cases {
		_, err := c.GetPod(context.Background(), "ns", "p", tc.uid, tc.wait)
		if (err != nil) != tc.wantErr {
			t.Errorf("GetPod(uid %q, wait %s) error = %v, want error: %v", tc.uid, tc.wait, err, tc.wantErr)
		}
		if q := <-queries; q != tc.wantQuery {
			t.Errorf("GetPod(uid %q, wait %s) asked with query %q, want %q", tc.uid, tc.wait, q, tc.wantQuery)
		}
	}
}

// TestAgentClientGivesUpOnAHungAgent: an agent that accepts the connection and never
// answers costs the plugin the timeout, not more.
func TestAgentClientGivesUpOnAHungAgent(t *testing.T) {
	sock := filepath.Join(shortdir.New(t), "pods.sock")
	silent.Listen(t, "unix", sock)
	start := time.Now()
	_, err := NewAgentClient(sock, 100*time.Millisecond).GetPod(context.Background(), "ns", "p", "", 0)
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
	_, err := NewAgentClient(sock, time.Second).GetPod(context.Background(), "ns", "p", "", 0)
	if err == nil || !strings.Contains(err.Error(), "answered 500") || !strings.Contains(err.Error(), "bytes)") || len(err.Error()) > 200 {
		t.Fatalf("GetPod from an agent answering 500 with %d bytes: %v; want a short error naming the status and the length", len(long), err)
	}
}
