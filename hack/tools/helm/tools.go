//go:build tools

// Package helm pins the helm v3 CLI used by the chart tests (test/chart) and by
// `make demo`. It is its own module so that neither the project's module nor the
// other pinned tools inherit helm's Kubernetes library versions.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
