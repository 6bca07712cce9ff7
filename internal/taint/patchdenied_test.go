package taint

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// TestAPatchThatKeepsFailingIsLoggedOncePerNode: the leader may not patch nodes (the
// grant dropped, or an admission policy denies taints), so every node that needs
// the taint fails at every retry. Each failure is counted, but each node's lasting
// failure is one warning, not one per retry: the back-off reaches 30 s, 120 lines
// an hour for each node, on one agent.
func TestAPatchThatKeepsFailingIsLoggedOncePerNode(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	if err := cp.EnsureNamespace(t.Context(), agentNS); err != nil {
		t.Fatal(err)
	}
	nodes := []string{"node-a", "node-b", "node-c"}
	for _, n := range nodes {
		createNode(t, admin, n)
	}
	createDaemonSet(t, admin, "istio-cni-node", nil)
	var noPatch []rbacv1.PolicyRule
	for _, r := range taintRules {
		if r.Resources[0] == "nodes" {
			r.Verbs = []string{"get", "list", "watch"}
		}
		noPatch = append(noPatch, r)
	}
	var log logbuf.Buffer
	c, err := New(testConfig("replica-a"), cp.ServiceAccountClientForTest(t, agentNS, "taint-no-patch", noPatch),
		Deps{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	background.Run(t, c.Run)

	failures := func() uint64 { return c.Metrics().PatchFailures.Load() }
	// Retries at 0.1, 0.3, 0.7, 1.5, 3.1 s: at least 5 failures for each node.
	settle(t, func() bool { return failures() >= 5*uint64(len(nodes)) })
	if got := failures(); got < 5*uint64(len(nodes)) {
		t.Fatalf("%d patch failures, want at least %d (5 per node): the patches are not denied?\n%s", got, 5*len(nodes), log.String())
	}
	time.Sleep(100 * time.Millisecond) // the last failure's line
	for _, n := range nodes {
		got := 0
		for _, line := range strings.Split(log.String(), "\n") {
			if strings.Contains(line, `msg="node taint not updated`) && strings.Contains(line, " node="+n+" ") {
				got++
			}
		}
		if got != 1 {
			t.Errorf("node %s: %d warnings (of %d denied patches in all), want 1:\n%s", n, got, failures(), log.String())
		}
	}
}
