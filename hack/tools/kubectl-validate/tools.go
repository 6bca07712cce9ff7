//go:build tools

// Package kubectlvalidate pins sigs.k8s.io/kubectl-validate, which validates rendered
// manifests offline against the built-in schemas of a chosen Kubernetes version. It
// is its own module: it is built with the Kubernetes libraries it was released with
// (v0.30), which helm's newer ones would replace if both shared a go.mod.
package kubectlvalidate

import _ "sigs.k8s.io/kubectl-validate"
