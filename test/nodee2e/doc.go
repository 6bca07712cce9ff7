// Package nodee2e installs istio-cni with its Helm chart on a real local node
// (kubelet + containerd, test/harness/node) and checks it with real pods and real
// traffic: the agent puts the plugin into the node's CNI config, a meshed pod gets
// the capture and its connections go through the istio-proxy stand-in both ways, a
// pod in an excluded namespace is left alone, helm upgrade rewrites the config,
// the agent puts its entry back when the primary CNI rewrites its file, standalone
// mode writes its own file, pods with hostUsers: false (a user namespace of their
// own) are captured by both backends, and helm uninstall leaves the CNI dirs as
// they were.
// The tests need root and fail without it.
package nodee2e
