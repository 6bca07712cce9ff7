package scale

import rbacv1 "k8s.io/api/rbac/v1"

// The agents' namespace, DaemonSet and labels, as the chart names them.
const (
	agentNamespace = "istio-system"
	daemonSetName  = "istio-cni-node"
	agentLabelKey  = "k8s-app"
	agentLabel     = "istio-cni-node"
)

// AgentRules are the chart's grants to the agent (clusterrole.yaml and role.yaml
// with its defaults and taint.enabled=true: the pod cache, repair deleting and
// labelling pods, the taint controller), in one ClusterRole. test/chart checks
// that they are what the chart renders, so that the simulation's agents cannot
// hold rights the chart does not give, or lack one it does.
var AgentRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
	{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list"}},   // the exit decision's
	{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"list", "watch"}}, // the taint controller's
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"istio-cni-plugin"}, Verbs: []string{"create"}},
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, ResourceNames: []string{"istio-cni-plugin"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"istio-cni-taint"}, Verbs: []string{"get", "update"}},
}

// AgentEnv is what the chart's DaemonSet gives every agent (values.yaml defaults,
// with taint.enabled=true and repair in place off: this machine's nodes are not
// real, so a broken pod is deleted, the chart's default action without repairPods).
// test/chart checks each value against the rendered DaemonSet's.
var AgentEnv = []string{
	"CHAINED_CNI_PLUGIN=false", // not the chart's: the simulated nodes have no primary CNI (AgentEnvNotTheCharts)
	"POD_NAMESPACE=" + agentNamespace,
	"PLUGIN_SERVICE_ACCOUNT=istio-cni-plugin",
	"UNINSTALL_ON_EXIT=auto",
	"POD_CACHE_ENABLED=true",
	"REPAIR_ENABLED=true",
	"REPAIR_REPAIR_PODS=false",
	"REPAIR_DELETE_PODS=true",
	"REPAIR_LABEL_PODS=true",
	"TAINT_ENABLED=true",
	"TAINT_RETRY_PERIOD=15s",
	"TAINT_RENEW_DEADLINE=20s",
	"TAINT_LEASE_DURATION=40s",
	"AGENT_LOG_LEVEL=info",
}

// AgentEnvNotTheCharts are the AgentEnv variables the simulation sets otherwise
// than the chart, and why.
var AgentEnvNotTheCharts = map[string]string{
	"POD_NAMESPACE":      "the release's namespace: the chart's test renders into kube-system, the simulation's agents run in istio-system",
	"CHAINED_CNI_PLUGIN": "the simulated nodes have no primary CNI to chain to, so the agent writes a config of its own",
}
