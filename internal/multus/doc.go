// Package multus is what the agent knows of Multus, the meta-plugin through which
// pods join the plugin on OpenShift (standalone mode): the pod annotation
// k8s.v1.cni.cncf.io/networks in both of its forms (ParseNetworks, Attaches), and
// the agent's switch for that mode and the network's name (Mode,
// MULTUS_ENABLED and MULTUS_NETWORK_NAME). It links no Kubernetes client: the
// repair controller and the troubleshooting tools read annotations with it, and
// package nad keeps the NetworkAttachmentDefinitions.
package multus
