// Package nad keeps the NetworkAttachmentDefinition through which Multus attaches
// pods to the plugin (OpenShift, standalone mode) present in every namespace that
// needs it: one with meshed pods, or labelled for injection. Without it a meshed
// pod fails to start with a Multus error.
//
// It runs on one agent of the cluster at a time (package lease). It creates the
// object where it is missing and never updates or deletes one: those it created
// carry the label app.kubernetes.io/managed-by=istio-cni-node and an owner
// reference to the chart's ClusterRole, so Kubernetes' garbage collector removes
// them, and only them, when the chart is uninstalled; an agent's restart or
// upgrade leaves them in place. README.md says why, and what each setting and
// grant is for.
package nad
