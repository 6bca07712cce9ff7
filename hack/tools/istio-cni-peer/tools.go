//go:build tools

// Package peer pins Istio's own CNI plugin (cni/cmd/istio-cni), the peer that make
// bench and make bench-add measure this plugin's ADD against. It is its own module
// so that the project's module does not inherit Istio's dependencies. The Go
// module proxy serves Istio only at some commits of its main branch, not at its
// release tags; the one pinned is 1.30.0-alpha.1-48-gb01690e6db7 (2026-04-23).
package peer

import _ "istio.io/istio/cni/cmd/istio-cni"
