package livetemp

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveAbandoned: what a live writer holds stays; what no one holds (a killed
// writer's, whose lock the kernel dropped) goes, a directory with its content; a
// symbolic link goes, not what it points to; a path already gone is no error.
func TestRemoveAbandoned(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name        string
		make        func(t *testing.T) (path string, release func())
		wantRemoved bool
	}{
		{"file a live writer holds", func(t *testing.T) (string, func()) {
			f, err := CreateTemp(dir, ".f.tmp-*")
			if err != nil {
				t.Fatal(err)
			}
			return f.Name(), func() { f.Close() }
		}, false},
		{"file its writer closed (killed)", func(t *testing.T) (string, func()) {
			f, err := CreateTemp(dir, ".f.tmp-*")
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			return f.Name(), func() {}
		}, true},
		{"file no writer ever locked", func(t *testing.T) (string, func()) {
			p := filepath.Join(dir, ".old.tmp-1")
			if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
				t.Fatal(err)
			}
			return p, func() {}
		}, true},
		{"directory a live writer holds", func(t *testing.T) (string, func()) {
			p, release, err := MkdirTemp(dir, ".b-")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "s"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return p, release
		}, false},
		{"directory released, with content", func(t *testing.T) (string, func()) {
			p, release, err := MkdirTemp(dir, ".b-")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "s"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			release()
			return p, func() {}
		}, true},
		{"symbolic link", func(t *testing.T) (string, func()) {
			p := filepath.Join(dir, ".link.tmp-1")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p, func() {}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path, release := tc.make(t)
			defer release()
			removed, err := RemoveAbandoned(path)
			if err != nil {
				t.Fatalf("RemoveAbandoned: %v", err)
			}
			_, statErr := os.Lstat(path)
			if removed != tc.wantRemoved || os.IsNotExist(statErr) != tc.wantRemoved {
				t.Errorf("removed = %v, gone = %v; want %v", removed, os.IsNotExist(statErr), tc.wantRemoved)
			}
		})
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "kept" {
		t.Errorf("a link's target changed: %q, %v", b, err)
	}
	if removed, err := RemoveAbandoned(filepath.Join(dir, "missing")); removed || err != nil {
		t.Errorf("RemoveAbandoned(missing) = %v, %v; want false, nil", removed, err)
	}
}

// TestCreateTempHoldsUntilClosed: the lock goes with the file's close, which a
// writer makes after its rename: the renamed file is then no temporary.
func TestCreateTempHoldsUntilClosed(t *testing.T) {
	dir := t.TempDir()
	f, err := CreateTemp(dir, ".x.tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if removed, _ := RemoveAbandoned(f.Name()); removed {
		t.Fatal("removed while held")
	}
	f.Close()
	if removed, err := RemoveAbandoned(f.Name()); !removed || err != nil {
		t.Errorf("after close: removed = %v, %v; want true", removed, err)
	}
}
