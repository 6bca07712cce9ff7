// Package daemonset answers, from the API objects alone, the two questions both
// the agent's exit decision and the node readiness controller ask about the
// agent's DaemonSet: which DaemonSet runs a pod, and whether a DaemonSet runs a
// pod on a node. One answer for both, so that the agent never uninstalls from a
// node the taint controller still expects an agent on, nor the reverse.
package daemonset
