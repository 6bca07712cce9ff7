package scale

import (
	"os"
	"testing"
)

// TestMain removes the binaries built for the agents once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}
