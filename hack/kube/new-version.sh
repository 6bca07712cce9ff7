#!/usr/bin/env bash
# Writes hack/kube/<version>/ (go.mod, go.sum, tools.go): a module that builds the
# Kubernetes components of that release from the Go module proxy. Each staging
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
} >"$dir/go.mod"
cat >"$dir/tools.go" <<GO
//go:build tools

// Package kube pins the Kubernetes $v components the local control plane and node
// are built from (see ../../kube-binaries.sh). It is its own module so that the
// project's module does not depend on k8s.io/kubernetes.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
gofmt -w "$dir/tools.go"
(cd "$dir" && go mod tidy -e)
echo "$dir"
