#!/usr/bin/env bash
# Builds the container runtime of the local node, containerd (with its runc shim and
# ctr) and runc, from the Go module proxy into a cache outside the repository keyed
# by their versions, and prints that directory. Only the first run builds (about two
# minutes on 2 cores); later runs print the directory at once.
#   CONTAINERD_VERSION=v2.4.2 RUNC_VERSION=v1.5.2 hack/runtime-binaries.sh
# runc is linked statically with libseccomp (Debian's libseccomp-dev, which
# hack/install-deps.sh installs), so it runs wherever it is copied.
set -euo pipefail
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
[[ $CONTAINERD_VERSION =~ ^v2\.[0-9]+\.[0-9]+$ ]] || { echo "runtime-binaries: CONTAINERD_VERSION=$CONTAINERD_VERSION: the node runs containerd 2.x (v2.MINOR.PATCH)" >&2; exit 1; }
[[ $RUNC_VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "runtime-binaries: RUNC_VERSION=$RUNC_VERSION is not v1.MINOR.PATCH" >&2; exit 1; }
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/runtime-containerd-${CONTAINERD_VERSION}-runc-${RUNC_VERSION}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
ctrd=github.com/containerd/containerd/v2
todo=()
for b in containerd containerd-shim-runc-v2 ctr runc; do [[ -x $cache/$b ]] || todo+=("$b"); done
n=0
for b in "${todo[@]}"; do
  n=$((n + 1))
  echo "runtime-binaries: [$n/${#todo[@]}] building $b into $cache (first run only)..." >&2
  start=$(date +%s)
  tmp=$cache/.gobin
  rm -rf "$tmp"
  if [[ $b == runc ]]; then
    GOBIN=$tmp CGO_ENABLED=1 GOFLAGS=-buildvcs=false go install -trimpath -tags 'seccomp netgo osusergo' \
      -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -extldflags -static" "github.com/opencontainers/runc@$RUNC_VERSION"
  else
    GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath \
      -ldflags "-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION -X $ctrd/version.Revision=module-proxy" "$ctrd/cmd/$b@$CONTAINERD_VERSION"
  fi
  mv "$tmp/$b" "$cache/$b"
  rm -rf "$tmp"
  echo "runtime-binaries: [$n/${#todo[@]}] $b built in $(( $(date +%s) - start ))s" >&2
done
echo "$cache"
