// Command istio-cni-doctor answers "is this pod's traffic redirected, and if not,
// why?" with the plugin's own decision and capture code.
package main

import (
	"os"

	"github.com/istio-cni/istio-cni/internal/doctor"
)

func main() {
	os.Exit(doctor.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
