// Package shortdir makes test directories whose paths stay short whatever the
// test's name and TMPDIR: a unix socket's path must fit the kernel's 108 bytes
// (sun_path), and t.TempDir() is named after the test, subtest included, so an
// agent's run dir under it put its sockets over that on a machine with a
// longer TMPDIR than /tmp.
package shortdir

import (
	"os"
	"testing"
)

// New makes an empty directory under the system's temporary directory, removed
// when tb's test ends.
func New(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "t-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}
