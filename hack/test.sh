#!/usr/bin/env bash
# The test command (make test, .ci/run): installs and builds what the tests need
# (first run only), records the host, runs every test, and fails if the run left the
# host changed (hack/hostcheck: paths, sysctls, mounts, links, routes, netfilter,
# processes), so a test that depends on or leaves state on a developer's machine is
# caught on every run, not on the next fresh machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ $(id -u) -eq 0 ]] || { echo "make test: needs root (network namespaces, netfilter, a real kubelet and containerd); run it with sudo" >&2; exit 1; }
began=$(date +%s)
step() { echo "== make test: $* ($(( $(date +%s) - began ))s)" >&2; }

step "installing Debian packages when missing"
hack/install-deps.sh
step "building Kubernetes ${KUBE_VERSION:-$(cat hack/kube/DEFAULT)}, containerd, runc, CNI plugins, helm, kubectl-validate, syft, promtool, the registry when not cached (first run: about 20 minutes on 2 cores)"
# syft and promtool (large modules, each in a cache dir and lock of its own) build
# beside the Kubernetes binaries: module downloads and links overlap the other builds.
hack/tools/install.sh syft >/dev/null & syft_build=$!
hack/tools/install.sh promtool >/dev/null & promtool_build=$!
hack/kube-binaries.sh etcd kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy kubectl >/dev/null
hack/runtime-binaries.sh >/dev/null
hack/cni-plugins.sh >/dev/null
hack/tools/install.sh >/dev/null
wait "$syft_build" || { echo "make test: building syft failed" >&2; exit 1; }
wait "$promtool_build" || { echo "make test: building promtool failed" >&2; exit 1; }
hack/registry-binary.sh >/dev/null

cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}
mkdir -p "$cache/hostcheck"
hc=$cache/hostcheck/hostcheck
go build -o "$hc" ./hack/hostcheck
record=$cache/hostcheck/before-$$.json
# Left out of the record: the caches (meant to stay) and the checkout, wherever they are.
keep=("$cache" "$(go env GOCACHE)" "$(go env GOMODCACHE)" "$root")
step "recording the host"
"$hc" save "$record" "${keep[@]}"

# Istio's expected rules (27 inputs) are not part of the repository: the
# conformance test reads them from ISTIO_REFERENCE_DIR or from shared/ beside the
# checkout, and skips without them. Whether it ran is said here, where a skip
# inside `go test` would not show.
ref=${ISTIO_REFERENCE_DIR:-$root/../shared/reference/istio-iptables-capture}
if [[ -f $ref/cases.json ]]; then
  export ISTIO_REFERENCE_DIR=$(cd "$ref" && pwd)
  conformance="checked against $ISTIO_REFERENCE_DIR"
else
  conformance="NOT CHECKED: no $ref/cases.json (set ISTIO_REFERENCE_DIR, or place shared/ beside the checkout)"
fi
step "conformance with Istio's reference rules: $conformance"

rc=0
# TEST_FLAGS adds flags to go test (for example TEST_FLAGS="-run Chart -v").
step "go vet"
go vet ./... || rc=1
if ((rc == 0)); then
  step "go test (about 6 minutes once built)"
  go test -count=1 -timeout 30m ${TEST_FLAGS:-} ./... || rc=1
fi
# The README's first command runs here too, so that it cannot break unseen (about
# 40 s once built; not with TEST_FLAGS, which picks tests).
if ((rc == 0)) && [[ -z ${TEST_FLAGS:-} ]]; then
  step "make demo's program (hack/demo): a node, the chart, meshed pods, traffic through the proxies"
  go run ./hack/demo </dev/null || rc=1
fi
step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [[ -n $unformatted ]]; then
  echo "gofmt would change: $unformatted" >&2
  rc=1
fi
step "comparing the host with the record"
"$hc" compare "$record" "${keep[@]}" || rc=1
rm -f "$record"
step "conformance with Istio's reference rules: $conformance"
step "done, exit $rc"
exit $rc
