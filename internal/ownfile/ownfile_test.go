package ownfile

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// TestRemovesOnlyWhatIsStillItsOwn: a socket or directory replaced by another
// process's since it was made stays; the one still made by this process goes.
func TestRemovesOnlyWhatIsStillItsOwn(t *testing.T) {
	socket := func(t *testing.T, path string) os.FileInfo {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		t.Cleanup(func() { l.Close() })
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	// A directory is held open, as the package doc asks: ext4 gives a directory made
	// after another's removal that one's inode at once.
	dir := func(t *testing.T, path string) os.FileInfo {
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "f"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		fi, err := d.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	cases := []struct {
		name     string
		make     func(t *testing.T, path string) os.FileInfo
		remove   func(path string, own os.FileInfo) error
		replaced bool
		wantGone bool
	}{
		{"own socket", socket, Remove, false, true},
		{"socket taken over by another process", socket, Remove, true, false},
		{"own directory", dir, RemoveAll, false, true},
		{"directory taken over by another process", dir, RemoveAll, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(shortdir.New(t), "x")
			own := tc.make(t, path)
			if tc.replaced {
				if err := os.RemoveAll(path); err != nil {
					t.Fatal(err)
				}
				tc.make(t, path)
			}
			if err := tc.remove(path, own); err != nil {
				t.Fatal(err)
			}
			_, err := os.Lstat(path)
			if gone := os.IsNotExist(err); gone != tc.wantGone {
				t.Errorf("after the removal: %s gone = %v (%v), want %v", path, gone, err, tc.wantGone)
			}
		})
	}
	t.Run("nothing recorded removes nothing", func(t *testing.T) {
		path := filepath.Join(shortdir.New(t), "x")
		dir(t, path)
		if err := RemoveAll(path, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("removed without a record of it: %v", err)
		}
	})
}
