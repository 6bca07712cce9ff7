package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The plugin widens its threads' timer slack (package timerslack/widen) while its
// packages initialise, before the heavy ones (TLS, x509, nftables, netlink): the
// Go runtime's monitor then stops waking every 20 us for the rest of the run.
// The order is the runtime's own account, GODEBUG=inittrace=1, of the built plugin.
func TestThePluginWidensItsTimerSlackBeforeItsHeavyPackagesInitialise(t *testing.T) {
	cmd := exec.Command(filepath.Join(pluginDir, "istio-cni"))
	cmd.Env = []string{"GODEBUG=inittrace=1", "CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("VERSION: %v: %s", err, stderr.String())
	}
	order := map[string]int{}
	for _, line := range strings.Split(stderr.String(), "\n") {
		// init PKG @T ms, D ms clock, B bytes, A allocs
		if f := strings.Fields(line); len(f) > 1 && f[0] == "init" {
			order[f[1]] = len(order)
		}
	}
	const widen = "github.com/istio-cni/istio-cni/internal/timerslack/widen"
	at, ok := order[widen]
	if !ok {
		t.Fatalf("%s is not initialised in the plugin (not imported by its main?); init trace:\n%s", widen, stderr.String())
	}
	for _, heavy := range []string{"crypto/tls", "crypto/x509", "github.com/google/nftables", "github.com/vishvananda/netlink"} {
		if h, ok := order[heavy]; ok && h < at {
			t.Errorf("%s is initialised before %s (%d < %d)", heavy, widen, h, at)
		}
	}
}
