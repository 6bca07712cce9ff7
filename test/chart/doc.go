// Package chart tests the Helm chart charts/istio-cni as users install it: helm lint
// --strict on every platform profile; every rendered object validated offline against
// Kubernetes 1.30's schemas (kubectl-validate) and decoded strictly into client-go's
// types; each value traced to the objects that carry it; bad values refused with a
// message naming them; Istio's platform switch rendering as its profile; golden renders
// of the profiles (go test -update rewrites them). helm and kubectl-validate are the versions pinned in hack/tools, built by
// hack/tools/install.sh into a cache outside the repository on first use.
package chart
