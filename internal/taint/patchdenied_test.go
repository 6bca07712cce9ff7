package taint

import (
	"log/slog"
	"slices"
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
// failure is one warning, not one per retry (the back-off reaches 30 s: 120 lines
// an hour for each node, on one agent), and its end is logged.
func TestAPatchThatKeepsFailingIsLoggedOncePerNodeAndItsEndToo(t *testing.T) {
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
		if got := linesOf(log.String(), `msg="node taint not updated`, " node="+n+" "); got != 1 {
			t.Errorf("node %s: %d warnings (of %d denied patches in all), want 1:\n%s", n, got, failures(), log.String())
		}
	}

	// The grant comes back: each node's next retry patches it, and the log says
	// the failure is over (the warning would otherwise be its last word).
	if _, err := cp.ServiceAccountKubeconfig(t.Context(), agentNS, "taint-no-patch", taintRules); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		waitTaints(t, admin, n, notReady)
		over := func() bool { return linesOf(log.String(), `msg="node taint up to date again"`, " node="+n+" ") == 1 }
		settle(t, over)
		if !over() {
			t.Errorf("node %s tainted, and the log does not say once that its failure is over:\n%s", n, log.String())
		}
	}
}

// linesOf counts the lines of log holding every one of parts.
func linesOf(log string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			n++
		}
	}
	return n
}
