// Package version holds the build's version: what `make image VERSION=...` and
// `make push TAG=...` stamp into every binary (-ldflags -X), "dev" otherwise. The
// agent logs it at start and exposes it as Istio's istio_build{component="cni"}.
package version

// Version is set at link time:
//
//	-ldflags "-X github.com/istio-cni/istio-cni/internal/version.Version=1.0.0"
var Version = "dev"

// LinkFlag is the -ldflags argument that sets Version to v.
func LinkFlag(v string) string {
	return "-X github.com/istio-cni/istio-cni/internal/version.Version=" + v
}
