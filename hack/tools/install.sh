#!/usr/bin/env bash
# Builds the pinned developer tools (helm v3, kubectl-validate, syft) from the Go module
# proxy into a cache directory outside the repository, keyed by their versions, and
# prints that directory. Only the first run builds (a few minutes on 2 cores); later
# runs print the directory at once. Each tool has its own go.mod and go.sum under
# hack/tools/<tool>/, so the versions and checksums are pinned in the repository.
#   dir=$(hack/tools/install.sh) && "$dir/helm" version
# With the argument syft it builds only syft (the scanner the image tests run) into a
# directory of its own and prints that one:
#   dir=$(hack/tools/install.sh syft) && "$dir/syft" version
# With the argument istio-cni-peer, the same for Istio's own CNI plugin, built as
# Istio's release builds are (stripped), which make bench and make bench-add run
# beside this plugin when ISTIO_CNI_PLUGIN names no other (a few minutes):
#   dir=$(hack/tools/install.sh istio-cni-peer) && ls "$dir/istio-cni-peer"
# With the argument promtool, the same for promtool (the metrics tests run `promtool
# check metrics`; Prometheus is a large module: about 30 minutes on a busy 2 cores):
#   dir=$(hack/tools/install.sh promtool) && "$dir/promtool" check metrics < metrics.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# pinned prints the version of module $2 that hack/tools/$1/go.mod requires, from
# the go.mod alone (go mod edit -json): go list -m may ask the module proxy for the
# version's details, and a cached build must not need the network.
pinned() {
  local v
  v=$(cd "$here/$1" && go mod edit -json | awk -v path="\"$2\"," '$1 == "\"Path\":" && $2 == path { getline; gsub(/[",]/, "", $2); print $2; exit }')
  [[ -n $v ]] || { echo "install.sh: no version of $2 in hack/tools/$1/go.mod" >&2; exit 1; }
  echo "$v"
}

# build <tool dir> <package> <binary name> <version>
build() {
  local dir=$1 pkg=$2 bin=$3 version=$4
  [[ -x "$cache/$bin" ]] && return 0
  echo "tools: building $bin $version into $cache (first run only)..." >&2
  local start; start=$(date +%s)
  local ldflags=""
  [[ $bin == helm ]] && ldflags="-X helm.sh/helm/v3/internal/version.version=${version} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${k8s_minor}"
  # syft reports the version its release build sets here.
  [[ $bin == syft ]] && ldflags="-X main.version=${version#v}"
  # Istio's release builds strip their binaries (82 MB instead of 120).
  [[ $bin == istio-cni-peer ]] && ldflags="-s -w"
  (cd "$here/$dir" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOBIN="$cache/.tmp" \
    go install -trimpath -ldflags "$ldflags" "$pkg")
  mv "$cache/.tmp/$(basename "$pkg")" "$cache/$bin"
  rmdir "$cache/.tmp" 2>/dev/null || true
  echo "tools: $bin built in $(( $(date +%s) - start ))s" >&2
}
# single <tool> <module> <package>: builds one tool into a cache dir of its own,
# keyed by its version, prints that dir and exits.
single() {
  local version
  version=$(pinned "$1" "$2")
  cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/tools-$1-${version}
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  build "$1" "$3" "$1" "$version"
  echo "$cache"
  exit 0
}
case ${1:-} in
  syft) single syft github.com/anchore/syft github.com/anchore/syft/cmd/syft ;;
  promtool) single promtool github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool ;;
  istio-cni-peer) single istio-cni-peer istio.io/istio istio.io/istio/cni/cmd/istio-cni ;;
  "") ;;
  *) echo "install.sh: unknown tool ${1} (syft, promtool, istio-cni-peer, or none for helm and kubectl-validate)" >&2; exit 2 ;;
esac

helm_version=$(pinned helm helm.sh/helm/v3)
kv_version=$(pinned kubectl-validate sigs.k8s.io/kubectl-validate)
# helm's default Kubernetes version (what `helm template` checks a chart's
# kubeVersion against without --kube-version) is set at link time, as helm's own
# Makefile does, from the client-go its go.mod requires.
k8s_minor=$(pinned helm k8s.io/client-go | cut -d. -f2)
# r2: the helm build with its default Kubernetes version set.
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/tools-helm-${helm_version}-kubectl-validate-${kv_version}-r2
mkdir -p "$cache"
# One builder at a time: parallel test processes may all ask for the tools.
exec 9>"$cache/.lock"
flock 9

build helm helm.sh/helm/v3/cmd/helm helm "$helm_version"
build kubectl-validate sigs.k8s.io/kubectl-validate kubectl-validate "$kv_version"
echo "$cache"
