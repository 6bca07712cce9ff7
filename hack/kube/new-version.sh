#!/usr/bin/env bash
# Writes hack/kube/<version>/ (go.mod, go.sum): a module that builds the Kubernetes
# components of that release (its go.mod's tool lines) from the Go module proxy. Each staging
# module (every k8s.io/kubernetes go.mod line that points at ./staging/...) is
# replaced by its published v0.<minor>.<patch>, and the go and godebug lines are
# the release's own. Checksums are verified against sum.golang.org by go mod tidy.
#   hack/kube/new-version.sh v1.36.3 [DIR]    (DIR defaults to hack/kube/<version>)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
v=${1:?usage: new-version.sh vMAJOR.MINOR.PATCH}
[[ $v =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "new-version.sh: $v is not a Kubernetes release (v1.MINOR.PATCH)" >&2; exit 1; }
minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]}
dir=${2:-$here/$v}
mkdir -p "$dir"
gomod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f $gomod ]] || { echo "new-version.sh: the module proxy has no k8s.io/kubernetes@$v" >&2; exit 1; }
godebug=$(grep -m1 '^godebug' "$gomod" || true)
{
  echo "// The Kubernetes $v components the local control plane and node are built from"
  echo "// (see ../../kube-binaries.sh), in a module of their own so that the project's"
  echo "// module does not depend on k8s.io/kubernetes."
  echo "module github.com/istio-cni/istio-cni/hack/kube/$v"
  echo
  grep -m1 '^go ' "$gomod"
  [[ -z $godebug ]] || printf '\n%s\n' "$godebug"
  echo
  echo "require k8s.io/kubernetes $v"
  echo
  echo "replace ("
  grep -E '=> \./staging/' "$gomod" | awk -v sv="v0.${minor}.${patch}" '{print "\t" $1 " => " $1 " " sv}'
  echo ")"
  echo
  echo "tool ("
  for c in kube-apiserver kube-controller-manager kube-proxy kube-scheduler kubectl kubelet; do
    echo "	k8s.io/kubernetes/cmd/$c"
  done
  echo ")"
} >"$dir/go.mod"
(cd "$dir" && go mod tidy -e)
echo "$dir"
