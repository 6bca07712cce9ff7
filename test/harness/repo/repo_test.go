package repo

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRootIsTheModulesRootFromAnyDirectoryBelowIt: from a package directory, and
// from a nested module's directory (whose go.mod is another module's), Root is
// the directory of the repository's go.mod; from outside the repository it is an
// error naming the module.
func TestRootIsTheModulesRootFromAnyDirectoryBelowIt(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(wd, "..", "..", "..")
	for _, dir := range []string{wd, filepath.Join(want, "hack", "node", "tools"), want} {
		t.Chdir(dir)
		got, err := Root()
		if err != nil {
			t.Fatalf("from %s: %v", dir, err)
		}
		if got != filepath.Clean(want) {
			t.Errorf("from %s: Root = %s, want %s", dir, got, want)
		}
	}
	t.Chdir(t.TempDir())
	if _, err := Root(); err == nil {
		t.Errorf("from outside the repository: Root succeeded, want an error")
	}
}

func TestModulePathReadsTheModuleDirective(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{"module github.com/istio-cni/istio-cni\n\ngo 1.26\n", Module},
		{"// a comment\nmodule \"github.com/istio-cni/istio-cni\"\n", Module},
		{"module github.com/istio-cni/istio-cni/hack/node/tools\n", "github.com/istio-cni/istio-cni/hack/node/tools"},
		{"modules x\n", ""},
		{"go 1.26\n", ""},
	} {
		if got := modulePath([]byte(tc.data)); got != tc.want {
			t.Errorf("modulePath(%q) = %q, want %q", tc.data, got, tc.want)
		}
	}
}
