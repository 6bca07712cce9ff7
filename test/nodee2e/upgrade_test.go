package nodee2e

import (
	"strings"
	"testing"
)

// Issue 16's goal on a real node: while meshed pods are created at a steady rate
// (churnScenario: 5 a second), the agent is upgraded with helm (a rebuilt image and
// a changed logLevel), killed with SIGKILL, stopped for 30 s (SIGSTOP, then
// SIGCONT) and the node rebooted (node.Reboot); then helm uninstall leaves the CNI
// dirs as before. Every pod must start captured (a sandbox refused and then
// retried is fine: the plugin fails closed), none may start unprotected, need the
// repair controller, or fail to start; the residents re-sandboxed by the reboot
// must hold the rules in their new network namespaces. The table of outcomes per
// phase is logged whether it passes or not.
func TestMeshedPodsStartCapturedThroughAgentUpgradeKillStopAndNodeReboot(t *testing.T) {
	s := session(t)
	res := runChurn(t, s, defaultChurn(), t.Logf)
	t.Logf("outcomes per phase:\n%s", res.table())
	if len(res.Problems) > 0 {
		const show = 40
		more := ""
		if len(res.Problems) > show {
			more = "\n..."
		}
		t.Logf("pods that did not start captured (%d):\n%s%s", len(res.Problems),
			strings.Join(res.Problems[:min(len(res.Problems), show)], "\n"), more)
	}
	for _, row := range res.Rows {
		if n := row.Outcomes[unprotected]; n > 0 {
			t.Errorf("%s: %d pods started without the capture", row.Name, n)
		}
		if n := row.Outcomes[repaired]; n > 0 {
			t.Errorf("%s: the repair controller acted on %d pods", row.Name, n)
		}
		if n := row.Outcomes[neverStarted]; n > 0 {
			t.Errorf("%s: %d pods never started within %s", row.Name, n, defaultChurn().StartBound)
		}
		if row.TrafficFailed > 0 {
			t.Errorf("%s: %d of %d sampled requests did not go through the proxies", row.Name, row.TrafficFailed, row.TrafficChecked)
		}
		if row.Name != rowResidents && row.Created == 0 {
			t.Errorf("%s: no pods were created during the phase: it proves nothing", row.Name)
		}
	}
	if res.Uninstall != nil {
		t.Errorf("helm uninstall left the CNI dirs changed: %v", res.Uninstall)
	}
}
