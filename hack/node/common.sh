# Shared by hack/node/up.sh and down.sh (sourced; $root is the repository root).
state=${ISTIO_CNI_NODE_STATE:-/var/lib/istio-cni-node}
pod_cidr=${ISTIO_CNI_NODE_POD_CIDR:-10.244.0.0/24}
# The pid, the command and its log live outside the state dir, which Up wants empty.
run=/run/istio-cni-node-$(basename "$state")
bin=$run/node

running() { [[ -f $run/pid ]] && kill -0 "$(cat "$run/pid")" 2>/dev/null; }

# build_kubectl builds upstream kubectl of the node's release (KUBE_VERSION, default
# hack/kube/DEFAULT) once, with the other components (hack/kube-binaries.sh), and
# sets kubectl_dir to where it is.
build_kubectl() {
  kubectl_dir=$("$root/hack/kube-binaries.sh" kubectl)
}
