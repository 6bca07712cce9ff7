package plugin

import (
	"bytes"
	"context"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/pluginlog"
)

// TestLookupLetsTheAgentWaitForThePod: the plugin asks the agent's socket with the
// sandbox's uid and AgentPodWait, and waits for its answer that much longer than
// AgentBound: an agent that answers 50 ms after AgentBound (as it does when it
// held the request until the pod's event came) is the answer, and the API server
// (a stand-in that fails the test) is never asked. The agent's side (holding the
// request until the event) is tested against a real API server in
// internal/podcache.
func TestLookupLetsTheAgentWaitForThePod(t *testing.T) {
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the API server was asked: %s", r.URL)
		http.NotFound(w, r)
	}))
	defer api.Close()
	cfg := lookupConfig(t, api.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw}))
	queries := make(chan string, 1)
	ln, err := net.Listen("unix", filepath.Join(cfg.AgentRunDir, PodCacheSocketName))
	if err != nil {
		t.Fatal(err)
	}
	agent := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries <- r.URL.RawQuery
		time.Sleep(AgentBound + 50*time.Millisecond)
		io.WriteString(w, `{"metadata":{"name":"web","namespace":"app","uid":"u1"},"spec":{"nodeName":"from-agent"}}`)
	})}
	go agent.Serve(ln)
	defer agent.Close()

	var buf bytes.Buffer
	log := pluginlog.New(&buf, pluginlog.Options{Level: slog.LevelDebug})
	defer log.Close()
	start := time.Now()
	p, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app", UID: "u1"}, log, PodLookup{Retries: 1, Interval: time.Second})
	if err != nil {
		t.Fatalf("lookup: %v\n%s", err, buf.String())
	}
	if p.Spec.NodeName != "from-agent" || !strings.Contains(buf.String(), "pod found in the agent's cache") {
		t.Errorf("the pod came from %q after %s, want the agent's answer; the plugin's log:\n%s", p.Spec.NodeName, time.Since(start), buf.String())
	}
	if q, want := <-queries, "uid=u1&wait=100"; q != want || AgentPodWait != 100*time.Millisecond {
		t.Errorf("asked the agent with %q (AgentPodWait %s), want %q", q, AgentPodWait, want)
	}
}
