package pluginlog

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRecordsReachStderrFileAndSocket proves one record goes to all three outputs,
// that the level filters, and that a missing socket is not an error.
func TestRecordsReachStderrFileAndSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "log.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	l := New(&stderr, Options{Level: slog.LevelInfo, File: filepath.Join(dir, "plugin.log"), Socket: sock})
	l.Debug("hidden")
	l.Info("cmdAdd", "pod", "default/web", "decision", "redirect")
	l.Close()

	if !strings.Contains(stderr.String(), "pod=default/web") || strings.Contains(stderr.String(), "hidden") {
		t.Errorf("stderr = %q", stderr.String())
	}
	file, _ := os.ReadFile(filepath.Join(dir, "plugin.log"))
	if !strings.Contains(string(file), `"pod":"default/web"`) {
		t.Errorf("file = %q", file)
	}
	buf := make([]byte, 4096)
	ln.SetReadDeadline(time.Now().Add(time.Second))
	n, err := ln.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(buf[:n], &rec); err != nil || rec["decision"] != "redirect" {
		t.Errorf("socket datagram = %q (%v)", buf[:n], err)
	}
	New(&stderr, Options{Socket: filepath.Join(dir, "absent.sock")}).Info("no agent")
}

// TestLogFileStaysWithinItsBound: however many plugin runs append to it, the file and
// its one rotated predecessor stay under 2 x MaxFileBytes, and the newest records are
// in the file.
func TestLogFileStaysWithinItsBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "istio-cni.log")
	line := strings.Repeat("x", 4096)
	for i := range 3000 { // about 12 MiB in all
		l := New(io.Discard, Options{File: path})
		l.Info("ADD", "run", i, "pad", line)
		l.Close()
	}
	var total int64
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		total += st.Size()
	}
	if total > 2*MaxFileBytes+8192 {
		t.Errorf("log files hold %d bytes, more than 2 x %d", total, MaxFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"run":2999`) {
		t.Error("the newest record is not in the log file")
	}
}
