package pluginlog

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestALogFileThatIsNotARegularFileIsNeitherWaitedForNorWritten: log_file comes
// from the network config. A FIFO there is not waited for (a FIFO no one reads
// would block a blocking open until a reader came, holding the plugin in its
// setup, before any bound of the command) and not written (one with a reader
// would take the records, and hold the plugin once its buffer is full): the
// plugin logs without the file and says so on stderr.
func TestALogFileThatIsNotARegularFileIsNeitherWaitedForNorWritten(t *testing.T) {
	for _, withReader := range []bool{false, true} {
		name := "a FIFO no one reads"
		if withReader {
			name = "a FIFO with a reader"
		}
		t.Run(name, func(t *testing.T) {
			fifo := filepath.Join(t.TempDir(), "istio-cni.log")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			var reader *os.File
			if withReader {
				var err error
				if reader, err = os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
					t.Fatal(err)
				}
				defer reader.Close()
			}
			var stderr bytes.Buffer
			done := make(chan *Logger, 1)
			go func() { done <- New(&stderr, Options{File: fifo}) }()
			var l *Logger
			select {
			case l = <-done:
			case <-time.After(2 * time.Second):
				// Unblock the open with a reader, which closes at once.
				if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
					(<-done).Close()
					f.Close()
				}
				t.Fatalf("New with log_file %s, a FIFO, had not returned after 2 s", fifo)
			}
			l.Info("cmdAdd", "pod", "default/web")
			l.Close()
			if withReader {
				reader.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				if n, _ := reader.Read(make([]byte, 4096)); n > 0 {
					t.Errorf("the FIFO received %d bytes, want none", n)
				}
			}
			want := fifo + ": not a regular file"
			if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "pod=default/web") {
				t.Errorf("stderr = %q, want the record and a warning with %q", stderr.String(), want)
			}
		})
	}
}
