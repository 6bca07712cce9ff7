package e2e

import (
	"path/filepath"
	"testing"
)

// The plugin widens its threads' timer slack (package timerslack/widen) while its
// packages initialise, before the heavy ones (TLS, x509, nftables, netlink): the
// Go runtime's monitor then stops waking every 20 us for the rest of the run.
// The order is the runtime's own account, GODEBUG=inittrace=1, of the built plugin.
func TestThePluginWidensItsTimerSlackBeforeItsHeavyPackagesInitialise(t *testing.T) {
	recs, trace, err := initTrace(filepath.Join(pluginDir, "istio-cni"))
	if err != nil {
		t.Fatal(err)
	}
	order := map[string]int{}
	for i, r := range recs {
		order[r.pkg] = i
	}
	const widen = "github.com/istio-cni/istio-cni/internal/timerslack/widen"
	at, ok := order[widen]
	if !ok {
		t.Fatalf("%s is not initialised in the plugin (not imported by its main?); init trace:\n%s", widen, trace)
	}
	for _, heavy := range []string{"crypto/tls", "crypto/x509", "github.com/google/nftables", "github.com/vishvananda/netlink"} {
		if h, ok := order[heavy]; ok && h < at {
			t.Errorf("%s is initialised before %s (%d < %d)", heavy, widen, h, at)
		}
	}
}
