// Package golden compares a test's output with a reviewed file under testdata, and
// rewrites the file from the output when the test runs with -update. Only tests
// import it.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the -update flag of every test binary that imports this package.
var update = flag.Bool("update", false, "rewrite the golden files from the tests' output")

// Updating reports whether the test runs with -update.
func Updating() bool { return *update }

// Check compares got with the file at path and reports a difference as a diff
// (-want +got). With -update it writes got to path (making its directory) instead.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it from the output)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update rewrites it if the change is intended):\n%s", path, diff)
	}
}
