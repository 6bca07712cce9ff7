package repair

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/istio-cni/istio-cni/test/harness/pods"
)

// hungWrites is a stand-in API server that lists one pod and holds a watch open,
// and does not answer the first write (DELETE or PATCH) until its client gives
// up; the writes after it are answered.
type hungWrites struct {
	pod      *corev1.Pod
	writes   atomic.Int32
	held     chan time.Time // when the first write came
	gaveUp   chan time.Time // when its client gave it up
	released chan struct{}
}

func (h *hungWrites) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && q.Get("watch") == "":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: h.pod.ResourceVersion}, Items: []corev1.Pod{*h.pod}})
	case r.Method == http.MethodGet && q.Get("watch") != "":
		if q.Get("sendInitialEvents") == "true" {
			http.Error(w, "no streaming list", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-h.released:
		}
	case (r.Method == http.MethodDelete || r.Method == http.MethodPatch) && !strings.Contains(r.URL.Path, "/events"):
		_, _ = io.Copy(io.Discard, r.Body)
		if h.writes.Add(1) == 1 {
			h.held <- time.Now()
			select {
			case <-r.Context().Done():
				h.gaveUp <- time.Now()
			case <-h.released:
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h.pod)
	default: // events
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("{}"))
	}
}

// TestAHungAPIServerHoldsARepairWorkerOnlyForTheAPITimeout: against an API server
// that never answers a write, the worker gives the DELETE (or the label's PATCH) up
// after the controller's API timeout, and retries: repair goes on. The agent's API
// client sets no overall timeout (it would cut the informers' watches), so the
// controller bounds each call itself.
func TestAHungAPIServerHoldsARepairWorkerOnlyForTheAPITimeout(t *testing.T) {
	const bound = time.Second
	cases := []struct {
		name   string
		delete bool
		action Action
	}{
		{"delete", true, ActionDelete},
		{"label", false, ActionLabel},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			broken := pods.Injected(testNS, "p", "node-a")
			broken.UID, broken.ResourceVersion = "uid-1", "5"
			broken.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "istio-validation",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126}}}}
			h := &hungWrites{pod: broken, held: make(chan time.Time, 1), gaveUp: make(chan time.Time, 1), released: make(chan struct{})}
			srv := httptest.NewServer(h)
			defer srv.Close()
			defer close(h.released)
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL}) // as agent.RestConfig: no Timeout
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig("node-a")
			cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = false, tc.delete, !tc.delete
			c, err := New(cfg, client, Deps{Workers: 1, APITimeout: bound,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done }()

			var held time.Time
			select {
			case held = <-h.held:
			case <-time.After(5 * time.Second):
				t.Fatal("the controller never wrote to the broken pod")
			}
			select {
			case gaveUp := <-h.gaveUp:
				if took := gaveUp.Sub(held); took < bound/2 || took > bound+2*time.Second {
					t.Errorf("the write was given up after %s, want about the API timeout %s", took, bound)
				}
			case <-time.After(bound + 5*time.Second):
				t.Fatalf("the repair worker still waits for its write %s after the API timeout (%s)", 5*time.Second, bound)
			}
			waitFor(t, "the write retried and answered", 5*time.Second, func() (bool, error) {
				return c.Metrics().PodsRepaired(tc.action, ResultSuccess) == 1, nil
			})
			if n := c.Metrics().PodsRepaired(tc.action, ResultFail); n != 1 {
				t.Errorf("%s failures = %d, want 1 (the write cut by the bound)", tc.action, n)
			}
		})
	}
}
