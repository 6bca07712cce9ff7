#!/usr/bin/env bash
# Builds the Kubernetes components and etcd from the Go module proxy into a cache
# outside the repository, keyed by version, and prints the cache directory. Only the
# first run pays (about 10-15 minutes on 2 cores for every component); later runs
# return at once.
#   KUBE_VERSION=v1.35.4 hack/kube-binaries.sh [component...]   (default: etcd kube-apiserver)
# KUBE_VERSION defaults to the newest release this project tests (hack/kube/DEFAULT).
# A release pinned under hack/kube/<version>/ builds from its checked-in go.mod and
# go.sum; any other is generated into the cache by hack/kube/new-version.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=${KUBE_VERSION:-$(cat "$here/kube/DEFAULT")}
ETCD_VERSION=v3.5.16
[[ $KUBE_VERSION =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || { echo "kube-binaries: KUBE_VERSION=$KUBE_VERSION is not v1.MINOR.PATCH" >&2; exit 1; }
minor=${BASH_REMATCH[1]}
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}
mkdir -p "$cache"
# One builder at a time: parallel test packages may all ask for the binaries.
exec 9>"$cache/.lock"
flock 9
components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd kube-apiserver)
mod=$here/kube/$KUBE_VERSION
if [[ ! -f $mod/go.sum ]]; then
  mod=$cache/module
  if [[ ! -f $mod/go.sum ]]; then
    echo "kube-binaries: $KUBE_VERSION is not pinned under hack/kube; generating its module in $mod" >&2
    "$here/kube/new-version.sh" "$KUBE_VERSION" "$mod" >/dev/null
  fi
fi
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor} -X $pkg.gitTreeState=clean"
done
todo=()
for c in "${components[@]}"; do [[ -x "$cache/$c" ]] || todo+=("$c"); done
n=0
for c in "${todo[@]}"; do
  n=$((n + 1))
  echo "kube-binaries: [$n/${#todo[@]}] building $c $KUBE_VERSION into $cache (first run only; minutes)..." >&2
  start=$(date +%s)
  if [[ $c == etcd ]]; then
    (cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -o "$cache/.etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$cache/.etcd.tmp" "$cache/etcd"
  else
    (cd "$mod" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -ldflags "$ldflags" -o "$cache/.$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$cache/.$c.tmp" "$cache/$c"
  fi
  echo "kube-binaries: [$n/${#todo[@]}] $c built in $(( $(date +%s) - start ))s" >&2
done
echo "$cache"
