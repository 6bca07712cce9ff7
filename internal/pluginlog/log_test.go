package pluginlog

import (
	"bytes"
	"encoding/json"
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
