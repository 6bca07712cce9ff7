#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster on this machine (test/harness/node):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2.x + runc,
# kubelet, kube-proxy, with the reference CNI plugins (ptp + host-local) as the primary network.
# Everything lives in one state dir; hack/node/down.sh takes it down and leaves the
# host as it was. Needs root.
#   hack/node/up.sh     start in the background; prints `export KUBECONFIG=...`
# Environment: ISTIO_CNI_NODE_STATE (default /var/lib/istio-cni-node),
#              ISTIO_CNI_NODE_POD_CIDR (default 10.244.0.0/24),
#              KUBE_VERSION (default hack/kube/DEFAULT), CONTAINERD_VERSION, RUNC_VERSION.
# The first run builds the Kubernetes binaries with kubectl (hack/kube-binaries.sh)
# and containerd and runc (hack/runtime-binaries.sh), minutes; later runs are up in
# about 10 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/hack/node/common.sh"

[[ $EUID -eq 0 ]] || { echo "hack/node/up.sh: needs root (containerd, kubelet, network namespaces)" >&2; exit 1; }
if running; then
  echo "already up (pid $(cat "$run/pid"))" >&2
  echo "export KUBECONFIG=$state/admin.kubeconfig"
  exit 0
fi
if [[ -d $state ]]; then
  echo "node: $state is left from a node that died; cleaning it up first" >&2
  "$bin" -cleanup -state "$state" -pod-cidr "$pod_cidr"
fi
"$root/hack/install-deps.sh"
"$root/hack/kube-binaries.sh" etcd kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy >/dev/null
"$root/hack/runtime-binaries.sh" >/dev/null
"$root/hack/cni-plugins.sh" >/dev/null
build_kubectl

mkdir -p "$run"
(cd "$root" && go build -o "$bin" ./test/harness/node/cmd/node)
# Not in a subshell: $! must be the command itself, the process down.sh signals. Run
# from the repository root so it finds hack/.
cd "$root"
nohup "$bin" -state "$state" -pod-cidr "$pod_cidr" </dev/null >"$run/node.out" 2>"$run/node.log" &
pid=$!
echo "$pid" >"$run/pid"
tail -n +1 -f "$run/node.log" --pid "$pid" >&2 &
tailer=$!
until grep -q '^export KUBECONFIG=' "$run/node.out" 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    kill "$tailer" 2>/dev/null || true
    echo "node failed; its log is $run/node.log" >&2
    rm -f "$run/pid"
    exit 1
  fi
  sleep 0.2
done
kill "$tailer" 2>/dev/null || true
cat >&2 <<MSG

The node is up. Use it with kubectl (built into $kubectl_dir):
  export PATH=$kubectl_dir:\$PATH
  export KUBECONFIG=$state/admin.kubeconfig
  kubectl get nodes -o wide
Or from Go: clientcmd.BuildConfigFromFlags("", "$state/admin.kubeconfig").
Images: pods can use only local images (imagePullPolicy: Never or IfNotPresent);
import one with node.(*Node).ImportImage, or ctr ($(hack/runtime-binaries.sh 2>/dev/null)/ctr):
  ctr -a $state/containerd/containerd.sock -n k8s.io images import IMAGE.tar
CNI: bin $state/cni/bin, conf $state/cni/net.d (10-ptp.conflist); logs: $state/logs
Take it down with: hack/node/down.sh
MSG
echo "export KUBECONFIG=$state/admin.kubeconfig"
