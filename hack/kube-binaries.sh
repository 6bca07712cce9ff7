#!/usr/bin/env bash
# Builds the Kubernetes components and etcd from the Go module proxy into a cache
# outside the repository, keyed by version, and prints the cache directory. Only the
# first run pays (about 10-20 minutes on 2 cores); later runs return at once.
#   hack/kube-binaries.sh [component...]   (default: etcd kube-apiserver)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=v1.33.13
ETCD_VERSION=v3.5.16
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}
mkdir -p "$cache"
# One builder at a time: parallel test packages may all ask for the binaries.
exec 9>"$cache/.lock"
flock 9
components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd kube-apiserver)
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=33 -X $pkg.gitTreeState=clean"
done
for c in "${components[@]}"; do
  [[ -x "$cache/$c" ]] && continue
  echo "kube-binaries: building $c into $cache (first run only; this takes minutes)..." >&2
  start=$(date +%s)
  if [[ $c == etcd ]]; then
    (cd "$here/etcd" && [[ -f go.sum ]] || (cd "$here/etcd" && go mod tidy -e >/dev/null 2>&1)
     cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -o "$cache/.etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$cache/.etcd.tmp" "$cache/etcd"
  else
    (cd "$here/kube" && [[ -f go.sum ]] || (cd "$here/kube" && go mod tidy -e >/dev/null 2>&1)
     cd "$here/kube" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$cache/.$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$cache/.$c.tmp" "$cache/$c"
  fi
  echo "kube-binaries: $c built in $(( $(date +%s) - start ))s" >&2
done
echo "$cache"
