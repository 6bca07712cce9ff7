#!/usr/bin/env bash
# Prints a directory holding Kubernetes VERSION's OpenAPI v3 schemas in the layout
# kubectl-validate's --local-schemas reads (api/v1.json, apis/<group>/<version>.json),
# taken from the api/openapi-spec/v3 files of that release's k8s.io/kubernetes
# module (the Go module proxy serves it; nothing is fetched from GitHub). Cached
# outside the repository by version.
#   hack/tools/k8s-schemas.sh v1.36.3
set -euo pipefail
v=${1:?usage: k8s-schemas.sh vMAJOR.MINOR.PATCH}
[[ $v =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "k8s-schemas: $v is not a Kubernetes release (v1.MINOR.PATCH)" >&2; exit 1; }
cache=${ISTIO_CNI_CACHE:-/var/cache/istio-cni}/k8s-schemas-$v
if [[ ! -f $cache/api/v1.json ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -d $dir/api/openapi-spec/v3 ]] || { echo "k8s-schemas: k8s.io/kubernetes@$v has no api/openapi-spec/v3" >&2; exit 1; }
  out=$tmp/out
  for f in "$dir"/api/openapi-spec/v3/*__*_openapi.json; do
    name=$(basename "$f" _openapi.json)        # api__v1, apis__apps__v1
    [[ $name == *__*__* || $name == api__* ]] || continue
    path=${name//__//}                          # api/v1, apis/apps/v1
    mkdir -p "$out/$(dirname "$path")"
    cp "$f" "$out/$path.json"
  done
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache"
  mv "$out" "$cache"
fi
echo "$cache"
