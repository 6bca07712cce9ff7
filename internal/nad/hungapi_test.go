package nad

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestAHungAPIServerHoldsTheWorkerOnlyForTheAPITimeout: against an API server that
// never answers, the worker's create, its read of the owner ClusterRole and the
// check that the NetworkAttachmentDefinition API is served are given up after the
// controller's API timeout, with an error that says so, and retried. The agent's
// API client sets no overall timeout (it would cut the informers' watches).
func TestAHungAPIServerHoldsTheWorkerOnlyForTheAPITimeout(t *testing.T) {
	const bound = 500 * time.Millisecond
	cases := []struct {
		name    string
		owner   string
		request string
	}{
		{"the create", "", "POST /apis/k8s.cni.cncf.io/v1/namespaces/apps/network-attachment-definitions"},
		{"the owner's read", ownerRole, "GET /apis/rbac.authorization.k8s.io/v1/clusterroles/" + ownerRole},
		{"the API check", "", "GET /apis/k8s.cni.cncf.io/v1/network-attachment-definitions"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			asked := make(chan string, 100)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked <- r.Method + " " + r.URL.Path
				_, _ = io.Copy(io.Discard, r.Body) // then the server sees the client give up
				<-r.Context().Done()               // never answers
			}))
			defer srv.Close()
			cfg := testConfig("a")
			cfg.OwnerClusterRole = tc.owner
			c, err := New(cfg, newTestClient(t, &rest.Config{Host: srv.URL}), Deps{APITimeout: bound, MissingCRDRetry: 10 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			start := time.Now()
			if tc.name == "the API check" {
				// It retries after each cut call: a second request comes.
				go func() { c.waitForAPI(ctx); done <- nil }()
				for i := range 2 {
					select {
					case got := <-asked:
						if got != tc.request {
							t.Errorf("asked %s, want %s", got, tc.request)
						}
					case <-time.After(bound + 5*time.Second):
						cancel()
						<-done
						t.Fatalf("request %d of the API check not made %s after the API timeout (%s): the first still waits", i+1, 5*time.Second, bound)
					}
				}
				if took := time.Since(start); took < bound || took > bound+2*time.Second {
					t.Errorf("the API check was retried after %s, want about the API timeout %s", took, bound)
				}
				cancel()
				<-done
				return
			}
			namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if err := namespaces.Add(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "apps",
				Labels: map[string]string{injectionLabel: "enabled"}}}); err != nil {
				t.Fatal(err)
			}
			r := &reconciler{c: c, namespaces: namespaces,
				pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
				defs: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
			go func() { done <- r.reconcile(ctx, "apps") }()
			select {
			case err := <-done:
				took := time.Since(start)
				if err == nil || !strings.Contains(err.Error(), "no answer from the API server within "+bound.String()) {
					t.Errorf("reconcile: %v, want the API timeout named", err)
				}
				if took < bound || took > bound+2*time.Second {
					t.Errorf("reconcile returned after %s, want about the API timeout %s", took, bound)
				}
			case <-time.After(bound + 5*time.Second):
				cancel()
				<-done
				t.Fatalf("the worker still waits for the API server %s after the API timeout (%s)", 5*time.Second, bound)
			}
			if got := <-asked; got != tc.request {
				t.Errorf("asked %s, want %s", got, tc.request)
			}
		})
	}
}
