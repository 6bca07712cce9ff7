// Command istio-cni is the Istio CNI plugin: a chained CNI plugin that sets up the
// traffic redirection of a pod's Istio sidecar when the pod's network is created.
package main

import (
	"fmt"
	"os"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/timerslack/widen" // at initialisation: see the package
	"github.com/istio-cni/istio-cni/internal/version"
)

// defaultPath is used when the runtime gives the plugin no PATH: the plugin runs
// iptables/nft, which live in the sbin directories.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func main() {
	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", defaultPath)
	}
	p := plugin.New()
	if widen.Err != nil {
		p.StartErr = fmt.Errorf("timer slack left at the kernel's default: %w", widen.Err)
	}
	cnicmd.Main(p.Funcs(), plugin.SupportedVersions, "istio-cni "+version.Version)
}
