package livetemp

import (
	"os"
	"os/exec"
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
			f, release, err := CreateTemp(dir, ".f.tmp-*")
			if err != nil {
				t.Fatal(err)
			}
			f.Close() // a writer closes before its rename; the lock stays
			return f.Name(), release
		}, false},
		{"file its writer released (killed)", func(t *testing.T) (string, func()) {
			f, release, err := CreateTemp(dir, ".f.tmp-*")
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			release()
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

// TestCreateTempHoldsUntilReleasedAndCanBeExecd: the lock goes with release, which
// a writer calls after its rename, not with the file's close, which comes before
// it: a binary the agent installs is exec'd by the runtime the moment it is in
// place, and a file still open for writing fails that with ETXTBSY (CI saw 3 of
// 47 execs fail when the lock was the writer's own descriptor).
func TestCreateTempHoldsUntilReleasedAndCanBeExecd(t *testing.T) {
	dir := t.TempDir()
	f, release, err := CreateTemp(dir, ".x.tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("#!/bin/sh\nexit 0\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(f.Name()).CombinedOutput(); err != nil {
		t.Errorf("exec of the closed, still locked file: %v %s", err, out)
	}
	if removed, _ := RemoveAbandoned(f.Name()); removed {
		t.Fatal("removed while held")
	}
	release()
	if removed, err := RemoveAbandoned(f.Name()); !removed || err != nil {
		t.Errorf("after release: removed = %v, %v; want true", removed, err)
	}
}
