//go:build tools

// Package kube pins the Kubernetes v1.35.4 components the local control plane and node
// are built from (see ../../kube-binaries.sh). It is its own module so that the
// project's module does not depend on k8s.io/kubernetes.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
