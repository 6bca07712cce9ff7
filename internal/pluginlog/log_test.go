package pluginlog

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
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
	sock, ln := listenAgent(t)
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

// TestReportReachesTheAgentWhateverTheLevel: an event goes out as one datagram of
// its own even when the level hides every record, and reads back as an event,
// while a log record does not.
func TestReportReachesTheAgentWhateverTheLevel(t *testing.T) {
	sock, ln := listenAgent(t)
	l := New(io.Discard, Options{Level: slog.LevelError, Socket: sock})
	l.Info("hidden")
	want := Event{Command: "ADD", Outcome: OutcomeFailed, Reason: ReasonApply, Seconds: 0.25}
	l.Report(want)
	l.Close()
	buf := make([]byte, 4096)
	ln.SetReadDeadline(time.Now().Add(time.Second))
	n, err := ln.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := ParseEvent(buf[:n])
	if !ok || got != want {
		t.Errorf("datagram %s read as %+v %v, want %+v", buf[:n], got, ok, want)
	}
	if _, ok := ParseEvent([]byte(`{"time":"t","level":"INFO","msg":"ADD","event":"x"}`)); ok {
		t.Error("a log record with an event field read as an event")
	}
	// No agent: nothing is sent and nothing fails.
	New(io.Discard, Options{Socket: filepath.Join(t.TempDir(), "absent.sock")}).Report(want)
}

// TestReportToAStuckAgentReturnsWithinItsBound: an agent that stopped reading
// (its socket's queue full) costs each Report about WriteBound, never an unbounded
// wait, so the ADD's result is not held up by it. The check allows for a loaded
// machine (a second per Report); the slowest is logged.
func TestReportToAStuckAgentReturnsWithinItsBound(t *testing.T) {
	sock, _ := listenAgent(t) // held open, never read
	l := New(io.Discard, Options{Socket: sock})
	defer l.Close()
	e := Event{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 0.01}
	var slowest time.Duration
	waited := 0
	// Until the socket's queue (net.unix.max_dgram_qlen datagrams) is full and a
	// few Reports have waited for it.
	for i := 0; i < 5000 && waited < 5; i++ {
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			l.Report(e)
			done <- time.Since(start)
		}()
		select {
		case took := <-done:
			slowest = max(slowest, took)
			if took >= WriteBound/2 {
				waited++
			}
		case <-time.After(time.Second):
			t.Fatalf("a Report to a stuck agent did not return within 1 s (its bound is %s)", WriteBound)
		}
	}
	if waited == 0 {
		t.Fatal("the socket's queue never filled: the test did not see a stuck agent")
	}
	t.Logf("slowest Report to a stuck agent: %s (bound %s)", slowest, WriteBound)
}

// TestUnderIstiosAgentTheRecordsArePostedInIstiosFormat: on a node where Istio's
// agent runs (its log.sock, no plog.sock), the records are posted at Close as
// Istio's plugin posts them, and they pass the checks Istio's agent makes
// (cni/pkg/log/uds.go: a JSON array of strings, each a JSON object with a string
// msg, a level among debug/info/warn/error in lower case, an RFC 3339 time).
func TestUnderIstiosAgentTheRecordsArePostedInIstiosFormat(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "log.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	type istioRecord struct {
		Level string    `json:"level"`
		Time  time.Time `json:"time"`
		Msg   string    `json:"msg"`
		Pod   string    `json:"pod"`
	}
	got := make(chan []istioRecord, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var posted []string
		if r.Method != http.MethodPost || r.URL.Path != IstioLogPath || json.NewDecoder(r.Body).Decode(&posted) != nil {
			t.Errorf("%s %s is not Istio's log post", r.Method, r.URL.Path)
		}
		var recs []istioRecord
		for _, p := range posted {
			var rec istioRecord
			if err := json.Unmarshal([]byte(p), &rec); err != nil {
				t.Errorf("record %q: %v", p, err)
			}
			recs = append(recs, rec)
		}
		got <- recs
	})}
	go srv.Serve(l)
	defer srv.Close()

	lg := New(io.Discard, Options{Level: slog.LevelInfo, Socket: filepath.Join(dir, "plog.sock"), IstioSocket: sock})
	lg.Info("ADD: pod passed through", "pod", "kube-system/coredns-1")
	lg.Warn("slow lookup", "pod", "kube-system/coredns-1")
	lg.Debug("hidden")
	lg.Report(Event{Command: "ADD", Outcome: OutcomePassedThrough}) // Istio's agent has no use for it
	lg.Close()
	select {
	case recs := <-got:
		if len(recs) != 2 {
			t.Fatalf("posted %d records, want 2: %+v", len(recs), recs)
		}
		for i, want := range []struct{ level, msg string }{{"info", "ADD: pod passed through"}, {"warn", "slow lookup"}} {
			r := recs[i]
			if r.Level != want.level || r.Msg != want.msg || r.Pod != "kube-system/coredns-1" || time.Since(r.Time) > time.Minute {
				t.Errorf("record %d = %+v, want level %q msg %q with the pod and a recent time", i, r, want.level, want.msg)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing was posted to Istio's agent")
	}
}

// TestJSONWritesStderrAsJSONLines: with JSON (the config's log_as_json) every
// stderr line is one JSON record; without it, text.
func TestJSONWritesStderrAsJSONLines(t *testing.T) {
	for _, asJSON := range []bool{true, false} {
		var stderr bytes.Buffer
		l := New(&stderr, Options{JSON: asJSON})
		l.Info("ADD: pod passed through", "pod", "kube-system/coredns-1")
		l.Close()
		var rec map[string]any
		err := json.Unmarshal(stderr.Bytes(), &rec)
		if asJSON && (err != nil || rec["pod"] != "kube-system/coredns-1" || rec["level"] != "INFO") {
			t.Errorf("JSON stderr = %q (%v)", stderr.String(), err)
		}
		if !asJSON && (err == nil || !strings.Contains(stderr.String(), "pod=kube-system/coredns-1")) {
			t.Errorf("text stderr = %q", stderr.String())
		}
	}
}

// BenchmarkReport is what an ADD's report to a reading agent costs the plugin: one
// JSON encoding and one datagram.
func BenchmarkReport(b *testing.B) {
	sock, ln := listenAgent(b)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := ln.Read(buf); err != nil {
				return
			}
		}
	}()
	l := New(io.Discard, Options{Socket: sock})
	defer l.Close()
	e := Event{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 0.0123}
	for b.Loop() {
		l.Report(e)
	}
}

// listenAgent is the agent's end of the plugin's socket: a datagram socket in a
// temporary directory, closed when the test ends.
func listenAgent(tb testing.TB) (string, *net.UnixConn) {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "plog.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return sock, ln
}
