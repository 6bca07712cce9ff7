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

// TestALeaderStoppedBeforeItsCachesSyncedLogsNoError: a leader whose informers
// have not listed yet when its term ends (the agent stopping, a lost lease) has
// nothing that failed: it logs no "taint controller stopped" error with
// "context canceled" as its cause, as the Multus controller logs none. Here the
// DaemonSets are not granted, so the caches never sync.
func TestALeaderStoppedBeforeItsCachesSyncedLogsNoError(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	// No daemonsets: the caches never sync.
	client := cp.ServiceAccountClientForTest(t, agentNS, "taint-nosync", []rbacv1.PolicyRule{taintRules[0], taintRules[1], taintRules[3]})
	var logs logbuf.Buffer
	c, err := New(testConfig("replica-a"), client, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := background.Run(t, c.Run)
	settle(t, c.Metrics().Leading.Load)
	time.Sleep(200 * time.Millisecond) // the term's informers are listing
	stop()
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a term that ended before its caches synced logged an error:\n%s", logs.String())
	}
}
