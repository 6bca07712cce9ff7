#!/usr/bin/env bash
# Builds the reference CNI plugins (spec 1.1.0) from the Go module proxy into a cache
# outside the repository, keyed by version, and prints the directory.
set -euo pipefail
VERSION=v1.9.1
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/cni-plugins-${VERSION}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
for p in main/ptp main/bridge main/loopback ipam/host-local meta/portmap; do
  name=${p##*/}
  [[ -x "$cache/$name" ]] && continue
  echo "cni-plugins: building $name $VERSION (first run only)..." >&2
  GOBIN="$cache" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "github.com/containernetworking/plugins/plugins/$p@$VERSION"
done
echo "$cache"
