// Package root is the tests' check that they run as root. A test that needs root
// (network namespaces, netfilter, a real control plane) fails without it, loudly,
// instead of skipping: a skipped test would pass CI without proving anything.
package root

import (
	"os"
	"testing"
)

// Require fails t at once unless the test runs as root.
func Require(t testing.TB) {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		t.Fatalf("this test needs root (network namespaces, netfilter), and it runs as uid %d: run it as root, as CI does", uid)
	}
}
