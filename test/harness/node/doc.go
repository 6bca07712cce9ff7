// Package node brings up, and takes down, a real single-node Kubernetes cluster on
// this machine: the control plane of test/harness/controlplane (etcd, kube-apiserver),
// kube-controller-manager, kube-scheduler, containerd 2.x with runc, a kubelet and
// kube-proxy (nftables mode), with the reference CNI plugins (ptp + host-local, a
// CNI 1.1.0 config list, so containerd runs the plugins' STATUS) as the primary
// network; pods may be dual-stack (Options.PodCIDRv6). Every component is built from
// the Go module proxy (hack/kube-binaries.sh with KUBE_VERSION,
// hack/runtime-binaries.sh with CONTAINERD_VERSION and RUNC_VERSION).
//
// Everything lives under one state directory (Options.StateDir): containerd's own
// config, root, state, socket and runc root, the CNI bin and conf dirs, kubelet's
// root dir, certificates and pod logs, the control plane's files, the caches of the
// tools run against it (ToolEnv). The host's /etc/containerd, /etc/cni and /opt/cni
// are never read or written.
//
// Some things cannot be moved into the state directory, and Down undoes them: the
// sysctls kubelet, ptp and dual-stack pods set on the host (restored to the values Up
// found), kube-proxy's nftables tables (Up refuses to start where another kube-proxy
// already has them), the iptables chains kubelet creates even with
// makeIPTablesUtilChains off, and the paths of HostPaths (libcni's cache, containerd's
// shim sockets, kubelet's /var/log/containers and device-plugin dir, libmount's
// /run/mount), each removed only when Up found it absent.
//
// Down goes in the order that lets each component undo its own work: controllers
// first (so nothing recreates pods), then pods are deleted while kubelet and
// containerd still run (so the CNI DEL happens), then kubelet and kube-proxy, then any sandbox left
// is stopped and removed through CRI, then containerd and its shims, then the
// apiserver before etcd, and last the mounts and files.
//
// Reboot does to a running node what a machine reboot does (see its doc): every
// container, shim, mount and /run-like state goes, then containerd, kubelet and
// kube-proxy start again and the kubelet re-creates the pods in new sandboxes.
//
// Images are made locally: the sandbox (pause) image is a tiny static Go program
// (hack/node/tools) packed by hack/image and imported with ctr; ImportImage does the
// same for any set of files.
package node
