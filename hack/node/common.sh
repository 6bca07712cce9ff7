# Shared by hack/node/up.sh and down.sh (sourced; $root is the repository root).
state=${ISTIO_CNI_NODE_STATE:-/var/lib/istio-cni-node}
pod_cidr=${ISTIO_CNI_NODE_POD_CIDR:-10.244.0.0/24}
# The pid, the command and its log live outside the state dir, which Up wants empty.
run=/run/istio-cni-node-$(basename "$state")
bin=$run/node
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}
kubectl_dir=$cache/kubectl-v1.33.13

running() { [[ -f $run/pid ]] && kill -0 "$(cat "$run/pid")" 2>/dev/null; }

# build_kubectl builds upstream kubectl from k8s.io/kubectl (hack/node/kubectl) once.
build_kubectl() {
  [[ -x $kubectl_dir/kubectl ]] && return 0
  echo "node: building kubectl into $kubectl_dir (first run only; this takes minutes)..." >&2
  mkdir -p "$kubectl_dir"
  local ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v1.33.13 -X $pkg.gitMajor=1 -X $pkg.gitMinor=33 -X $pkg.gitTreeState=clean"
  done
  (cd "$root/hack/node/kubectl" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$kubectl_dir/.kubectl.tmp" .)
  mv "$kubectl_dir/.kubectl.tmp" "$kubectl_dir/kubectl"
}
