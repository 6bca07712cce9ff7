#!/usr/bin/env bash
# Builds promtool (the metrics tests run `promtool check metrics` on the agent's
# /metrics) from the Go module proxy into a cache directory outside the repository,
# keyed by its version, and prints the binary's path. The version and checksums are
# pinned by hack/tools/promtool/go.mod and go.sum. Only the first run builds (a few
# minutes on 2 cores: Prometheus is a large module); later runs print the path at
# once. Its own cache directory, so that a new promtool does not rebuild helm.
#   "$(hack/tools/promtool.sh)" check metrics < metrics.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(cd "$here/promtool" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
[[ -n $version ]] || { echo "promtool.sh: no version of github.com/prometheus/prometheus in hack/tools/promtool/go.mod" >&2; exit 1; }
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/tools-promtool-${version}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ ! -x $cache/promtool ]]; then
  echo "tools: building promtool $version into $cache (first run only)..." >&2
  start=$(date +%s)
  (cd "$here/promtool" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOBIN="$cache/.tmp" \
    go install -trimpath github.com/prometheus/prometheus/cmd/promtool)
  mv "$cache/.tmp/promtool" "$cache/promtool"
  rmdir "$cache/.tmp" 2>/dev/null || true
  echo "tools: promtool built in $(( $(date +%s) - start ))s" >&2
fi
echo "$cache/promtool"
