// Command istio-cni is the Istio CNI plugin: a chained CNI plugin that sets up the
// traffic redirection of a pod's Istio sidecar when the pod's network is created.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/istio-cni/istio-cni/internal/plugin"
)

// version is set at build time (-X main.version=...).
var version = "dev"

func main() {
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.SupportedVersions, "istio-cni "+version)
}
