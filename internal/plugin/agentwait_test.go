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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/kube"
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

// TestWithoutTheSandboxsUIDOnlyAQuorumReadDecides: a runtime that passes no
// K8S_POD_UID gives no way to tell the pod from a predecessor of the same name. A
// live agent's file of that predecessor (its watch behind the delete of a
// StatefulSet pod deleted and recreated, now with a sidecar) must not decide: the pod is read from etcd (no
// resourceVersion=0, whose watch cache may be behind the delete too), and neither
// the agent's file nor its socket is asked. With the uid, the file of another uid
// is refused and the API server's cache is asked first, as before.
func TestWithoutTheSandboxsUIDOnlyAQuorumReadDecides(t *testing.T) {
	const current = `{"metadata":{"name":"web-0","namespace":"app","uid":"u-new"},"spec":{"nodeName":"from-api"}}`
	const predecessor = `{"metadata":{"name":"web-0","namespace":"app","uid":"u-old"},"spec":{"nodeName":"from-dead-agent"}}`
	for _, tc := range []struct {
		name, uid   string
		wantQueries []string
	}{
		{"the runtime passes the uid", "u-new", []string{"resourceVersion=0"}},
		{"the runtime passes no uid", "", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var queries []string
			var mu sync.Mutex
			api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				queries = append(queries, r.URL.RawQuery)
				mu.Unlock()
				io.WriteString(w, current)
			}))
			defer api.Close()
			cfg := lookupConfig(t, api.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw}))
			// What an agent whose watch is behind the delete holds: its file of the
			// predecessor (kept: its lock held), and its socket serving the same.
			dir := filepath.Join(cfg.AgentRunDir, kube.AgentPodFilesDir)
			keepAgentPodFiles(t, dir)
			path, _ := kube.AgentPodFile(dir, "app", "web-0")
			file, err := kube.EncodeAgentPodFile([]byte(predecessor))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, file, 0o600); err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("unix", filepath.Join(cfg.AgentRunDir, PodCacheSocketName))
			if err != nil {
				t.Fatal(err)
			}
			agent := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, predecessor)
			})}
			go agent.Serve(ln)
			defer agent.Close()

			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			p, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web-0", Namespace: "app", UID: tc.uid}, log, PodLookup{Retries: 1, Interval: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if p.Metadata.UID != "u-new" {
				t.Errorf("looked up uid %s (node %s), want the pod that exists now", p.Metadata.UID, p.Spec.NodeName)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(tc.wantQueries, queries); diff != "" {
				t.Errorf("the API server's GET queries (-want +got):\n%s", diff)
			}
		})
	}
}
