package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
)

// listenPluginLogs opens the unix datagram socket the plugin sends its log records
// to. A socket file left by a previous agent is replaced; any other file there is
// an error rather than something to delete.
func listenPluginLogs(path string) (*net.UnixConn, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("plugin log socket %s: a %s is in the way", path, fi.Mode().Type())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("plugin log socket %s: remove the stale socket: %w", path, err)
		}
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("plugin log socket: %w", err)
	}
	// Only root (the runtime running the plugin) may inject records.
	if err := os.Chmod(path, 0o600); err != nil {
		conn.Close()
		return nil, fmt.Errorf("plugin log socket: %w", err)
	}
	return conn, nil
}

// maxRecord bounds one datagram; the plugin's records are far smaller.
const maxRecord = 64 << 10

// servePluginLogs prints every record to out, one line each, so that `kubectl logs`
// of the agent shows the plugin's decisions, and counts ADD/DEL outcomes. It
// returns when conn is closed.
func servePluginLogs(conn *net.UnixConn, out io.Writer, m *metrics, log *slog.Logger) {
	buf := make([]byte, maxRecord)
	for {
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Error("plugin log socket", "error", err)
			}
			return
		}
		rec := buf[:n]
		for n > 0 && (rec[n-1] == '\n' || rec[n-1] == '\r') {
			n--
			rec = rec[:n]
		}
		if n == 0 {
			continue
		}
		m.add("istio_cni_plugin_log_records_total")
		line := make([]byte, 0, n+1)
		line = append(append(line, rec...), '\n')
		_, _ = out.Write(line)
		if cmd, outcome, ok := classifyPluginRecord(rec); ok {
			m.add("istio_cni_plugin_events_total", "command", cmd, "outcome", outcome)
		}
	}
}

// classifyPluginRecord reads the outcome of an ADD or DEL from the plugin's final
// record of that command. Other records (progress, debug) are no event. It follows
// the messages internal/plugin writes; DEL's "nothing to do" outcomes are logged
// at debug and so counted only when the plugin logs at debug.
func classifyPluginRecord(rec []byte) (command, outcome string, ok bool) {
	var r struct {
		Level   string `json:"level"`
		Msg     string `json:"msg"`
		Command string `json:"command"`
	}
	if json.Unmarshal(rec, &r) != nil {
		return "", "", false
	}
	switch r.Command {
	case "ADD":
		switch {
		case strings.HasPrefix(r.Msg, "ADD: traffic redirected"):
			return "ADD", "redirected", true
		case strings.HasPrefix(r.Msg, "ADD: pod passed through"):
			return "ADD", "passed_through", true
		case r.Level == "ERROR":
			return "ADD", "failed", true
		}
	case "DEL":
		switch r.Msg {
		case "DEL: done":
			return "DEL", "done", true
		case "DEL: no network namespace, nothing to do", "DEL: network namespace already gone":
			return "DEL", "nothing_to_do", true
		}
	}
	return "", "", false
}
