package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/istio-cni/istio-cni/internal/plugin"
)

// keyNode is the report key of the node check's finding (reconcileNode).
const keyNode = "node"

// nodeCheckHint says where the plugin config's settings that choose the backend
// come from, and when the agent looks again.
const nodeCheckHint = "native_nftables is the chart's nativeNftables value (true: the nftables backend, which runs no tool of the node's); " +
	"iptables_mode has no chart value (the agent's IPTABLES_MODE sets it in an entry the agent generates); " +
	"checked again after 1s, doubling to at most 30s, until the node can"

// nodeCheckMoreHint says which chart values let the node check see more.
const nodeCheckMoreHint = "the chart mounts the node's /usr, /sbin and /bin read-only with nodeCheck.mountToolDirs (the default, in iptables mode), " +
	"the node's whole filesystem through its /proc with repair.repairPods or troubleshooting.enabled, which also add what trying the kernel takes " +
	"(CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_NET_RAW), as privileged does"

// reconcileNode checks that the node can run the backend the plugin's entry
// gives it (plugin.CheckNode: the node's tools, seen through REPAIR_PROC_DIR,
// the node's /proc, or else in the node's /usr, /sbin and /bin mounted under
// NODE_DIRS_ROOT, and its kernel, tried in a throwaway network namespace), and
// reports whether to try again later. What it finds missing keeps the agent not
// ready: the entry stays installed (pods fail closed, never start uncaptured),
// and the readiness taint, where it is on, keeps pods off the node. The entry
// is fixed for the agent's run (a change of it is a new agent, which checks at
// start); the node's tools and kernel modules may come later, hence the retry.
func (a *agent) reconcileNode() (retry bool) {
	view := plugin.NodeViewIn(a.s.Repair.ProcDir, a.s.NodeDirsRoot)
	c := plugin.CheckNode(context.Background(), a.pluginCfg, view)
	if c.Problem != nil {
		a.nodeOK = false
		a.nodeSeen = ""
		a.m.backendUnusable.Set(1)
		a.report(keyNode, c.Problem, nodeCheckHint)
		return true
	}
	a.m.backendUnusable.Set(0)
	if !a.nodeOK { // a check found something missing before this one
		if len(c.NotChecked) == 0 {
			a.log.Info("this node can run the plugin's rule backend now", "backend", c.Backend)
		} else {
			a.log.Info("node check: what was missing for the plugin's rule backend is there now, in what this agent can check", "backend", c.Backend)
		}
	}
	a.nodeOK = true
	a.clearReport(keyNode)
	attrs := []any{"backend", c.Backend, "nodeRoot", view.Root}
	if view.Dirs != nil {
		attrs = append(attrs, "nodeDirs", strings.Join(view.Dirs, ","))
	}
	if c.Tools != nil {
		attrs = append(attrs, "detected", c.Tools.Detected, "restore", c.Tools.Restore)
	}
	if len(c.Families) > 0 {
		kernel := "took an IPv4 pod's rules and a dual-stack pod's"
		if len(c.Families) == 1 {
			kernel = "took an IPv4 pod's rules; IPv6 not tried: " + c.IPv6Skipped
		}
		attrs = append(attrs, "kernel", kernel)
	}
	if len(c.NotChecked) > 0 {
		attrs = append(attrs, "notChecked", strings.Join(c.NotChecked, "; "), "hint", nodeCheckMoreHint)
	}
	if seen := fmt.Sprint(attrs...); seen != a.nodeSeen {
		a.nodeSeen = seen
		if len(c.NotChecked) > 0 {
			a.log.Info("node check: nothing missing for the plugin's rule backend in what this agent can check, the rest not checked", attrs...)
		} else {
			a.log.Info("node check: this node runs the plugin's rule backend: its tools (if any) are installed and its kernel took a pod's rules in a throwaway network namespace", attrs...)
		}
	}
	return false
}
