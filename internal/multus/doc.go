// Package multus owns what the agent does for pods that join the plugin through
// Multus (OpenShift, standalone mode): reading a pod's
// k8s.v1.cni.cncf.io/networks annotation (Attaches), and keeping the
// NetworkAttachmentDefinition that the annotation names present in every
// namespace with meshed pods (Controller), so that a meshed pod does not fail to
// start for want of it.
//
// The controller runs on one agent of the cluster at a time (package lease). It
// creates the object where it is missing and never updates or deletes one: those
// it created carry the label app.kubernetes.io/managed-by=istio-cni-node and an
// owner reference to the chart's ClusterRole, so Kubernetes' garbage collector
// removes them, and only them, when the chart is uninstalled. README.md says
// why, and what each setting and grant is for.
package multus
