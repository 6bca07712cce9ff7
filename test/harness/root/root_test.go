package root

import (
	"os"
	"strings"
	"testing"
)

// fakeTB records a Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = format
}

func TestRequireFailsOnlyWithoutRoot(t *testing.T) {
	var f fakeTB
	Require(&f)
	asRoot := os.Geteuid() == 0
	if asRoot && f.fatal != "" {
		t.Errorf("Require failed as root: %s", f.fatal)
	}
	if !asRoot && !strings.Contains(f.fatal, "needs root") {
		t.Errorf("Require did not fail as uid %d (message %q)", os.Geteuid(), f.fatal)
	}
}
