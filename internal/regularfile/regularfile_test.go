package regularfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOpenRefusesWhatIsNotARegularFileWithoutWaiting: a FIFO with no peer (read or
// write), a directory and a missing path are refused at once, each in its own
// words; a regular file and a symbolic link to one are opened; ReadBounded reads
// a file of max bytes and refuses one of max+1.
func TestOpenRefusesWhatIsNotARegularFileWithoutWaiting(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		flag       int
		want       string // "" : opened
	}{
		{"a FIFO read", fifo, os.O_RDONLY, "fifo: not a regular file (named pipe)"},
		{"a FIFO written", fifo, os.O_WRONLY | os.O_APPEND, "fifo: not a regular file (named pipe)"},
		{"a directory", dir, os.O_RDONLY, "not a regular file (directory)"},
		{"a regular file", file, os.O_RDONLY, ""},
		{"a link to one", link, os.O_RDONLY, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				f, err := Open(tc.path, tc.flag, 0)
				if err == nil {
					f.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if tc.want == "" && err != nil {
					t.Fatalf("Open: %v", err)
				}
				if tc.want != "" && (err == nil || !errors.Is(err, ErrNotRegular) || !strings.HasSuffix(err.Error(), tc.want)) {
					t.Fatalf("Open = %v, want an ErrNotRegular ending %q", err, tc.want)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Open is still waiting after 2s")
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing"), os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want fs.ErrNotExist", err)
	}
	if b, err := ReadBounded(file, 5); err != nil || string(b) != "12345" {
		t.Errorf("ReadBounded(5 bytes, max 5) = %q, %v", b, err)
	}
	if _, err := ReadBounded(file, 4); err == nil || !strings.Contains(err.Error(), "larger than 4 bytes") {
		t.Errorf("ReadBounded(5 bytes, max 4) = %v, want refused naming the bound", err)
	}
}
