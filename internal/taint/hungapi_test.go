package taint

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestAHungAPIServerHoldsATaintWorkerOnlyForTheAPITimeout: against an API server
// that never answers, a worker's node patch (tainting a node whose agent is not
// ready) and its read before untainting a node that left the selector are given
// up after the controller's API timeout, with an error that says so: the worker
// is free again, and the node is retried with the queue's back-off. The agent's
// API client sets no overall timeout (it would cut the informers' watches).
func TestAHungAPIServerHoldsATaintWorkerOnlyForTheAPITimeout(t *testing.T) {
	const bound = 500 * time.Millisecond
	cases := []struct {
		name    string
		left    bool // the node left the cache: untaintLeft reads it first
		request string
	}{
		{"the patch of a node to taint", false, "PATCH /api/v1/nodes/node-a"},
		{"the read of a node that left the selector", true, "GET /api/v1/nodes/node-a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			asked := make(chan string, 10)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked <- r.Method + " " + r.URL.Path
				_, _ = io.Copy(io.Discard, r.Body) // then the server sees the client give up
				<-r.Context().Done()               // never answers
			}))
			defer srv.Close()
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL}) // as agent.RestConfig: no Timeout
			if err != nil {
				t.Fatal(err)
			}
			c, err := New(testConfig("a"), client, Deps{APITimeout: bound, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			r := hungReconciler(t, c, !tc.left)
			if tc.left {
				r.markLeft("node-a")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- r.reconcile(ctx, "node-a") }()
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

// hungReconciler is a reconciler over caches that hold node-a (unless absent), an
// agent DaemonSet that runs on every node, and no agent pod: node-a wants the taint.
func hungReconciler(t *testing.T, c *Controller, withNode bool) *reconciler {
	t.Helper()
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{nodeIndex: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}})
	daemonSets := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if withNode {
		if err := nodes.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"}}); err != nil {
			t.Fatal(err)
		}
	}
	agent := map[string]string{"k8s-app": "istio-cni-node"}
	if err := daemonSets.Add(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-node", Namespace: agentNS},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: agent}}}}); err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(c.cfg.AgentSelector)
	if err != nil {
		t.Fatal(err)
	}
	return &reconciler{c: c, nodes: nodes, pods: pods, daemonSets: daemonSets, agentSelector: sel,
		left: map[string]bool{}, handover: map[string]bool{}}
}
