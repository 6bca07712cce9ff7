package node

import (
	"fmt"
	"os"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/node"
)

// TestMain holds the machine-wide node lock for the whole package: other node users
// (test/nodee2e, make demo) share host-wide state with this package's nodes.
func TestMain(m *testing.M) {
	unlock, err := node.LockMachine()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	unlock()
	os.Exit(code)
}
