package e2e

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/istio-cni/istio-cni/internal/plugin"
)

// TestANewerConfigIsRefusedAndRetriedNotIgnored: adjacent versions, through the
// installed binary as a runtime runs it. A config of a newer schema than the binary
// knows (what a rollback or a copied file leaves) fails the ADD with CNI's "try
// again later" (the kubelet retries the sandbox) and no rules; the same config
// without the key (an older agent's, Istio's) captures the pod.
func TestANewerConfigIsRefusedAndRetriedNotIgnored(t *testing.T) {
	n := newNode(t, shared)
	pod := createPod(t, shared, meshedPod("versions", "web", nil))

	newer := n.chain(n.istioEntry(map[string]any{"config_schema": plugin.ConfigSchema + 1, "a_key_from_the_future": true}))
	sb := n.newSandbox(pod)
	_, err := n.add(newer, sb)
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater || !strings.Contains(cniErr.Msg, "understands up to") {
		t.Fatalf("ADD with a newer config = %v, want CNI error %d (try again later) saying which schema the binary understands", err, types.ErrTryAgainLater)
	}
	wantNoRules(t, sb, "a refused newer config")

	older := n.chain(n.istioEntry(nil))
	sb2 := n.newSandbox(pod)
	if _, err := n.add(older, sb2); err != nil {
		t.Fatalf("ADD with a config without config_schema: %v", err)
	}
	serveTraffic(t, n, sb2)
	expectCaptured(t, n, sb2)
}
