#!/usr/bin/env bash
# Builds the distribution registry (the reference OCI registry server, the program
# behind Docker's registry image) from the Go module proxy into a cache outside the
# repository, keyed by its version, and prints the binary's path. The tests run it on
# loopback with TLS and htpasswd auth (test/harness/registry). Only the first run
# builds (about a minute on 2 cores); later runs print the path at once.
#   REGISTRY_VERSION=v3.1.2 hack/registry-binary.sh
set -euo pipefail
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
[[ $REGISTRY_VERSION =~ ^v3\.[0-9]+\.[0-9]+$ ]] || { echo "registry-binary: REGISTRY_VERSION=$REGISTRY_VERSION is not v3.MINOR.PATCH" >&2; exit 1; }
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/registry-${REGISTRY_VERSION}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ ! -x $cache/registry ]]; then
  echo "registry-binary: building the distribution registry $REGISTRY_VERSION into $cache (first run only)..." >&2
  start=$(date +%s)
  tmp=$cache/.gobin
  rm -rf "$tmp"
  GOBIN=$tmp CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go install -trimpath -ldflags "-s -w" \
    "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
  mv "$tmp/registry" "$cache/registry"
  rm -rf "$tmp"
  echo "registry-binary: built in $(( $(date +%s) - start ))s" >&2
fi
echo "$cache/registry"
