package doctor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestAnAPIServerWithoutARouteIsNamedSo: run in a network namespace with no route
// to the API server's address (a new namespace: lo alone), the doctor's pod lookup
// fails with the kernel's "network is unreachable" and says what that means for a
// doctor in the agent's pod (the node's routes); refused on an address it can
// reach, it says nothing of routes.
func TestAnAPIServerWithoutARouteIsNamedSo(t *testing.T) {
	root.Require(t)
	ns, err := testns.New(t.TempDir(), "unroutable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	const hint = "this network namespace has no route to the API server's address: in the agent's pod that is the node's network (hostNetwork)"
	for _, tc := range []struct {
		name, server string
		wantErr      string
		wantHint     bool
	}{
		{"no route", "https://10.96.0.1:443", "network is unreachable", true},
		{"refused on lo", "https://127.0.0.1:1", "connection refused", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kube.NewClient(&kube.Kubeconfig{Server: tc.server, Token: "t"}, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var gerr error
			if err := netns.Do(ns, func() error {
				_, gerr = (&Node{Name: "node-1"}).GetPod(context.Background(), c, "default", "web")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if gerr == nil || !strings.Contains(gerr.Error(), tc.wantErr) {
				t.Fatalf("GetPod from a namespace without routes: %v, want an error with %q", gerr, tc.wantErr)
			}
			if got := strings.Contains(gerr.Error(), hint); got != tc.wantHint {
				t.Errorf("GetPod: %v\nhas the hint %q: %v, want %v", gerr, hint, got, tc.wantHint)
			}
		})
	}
}
