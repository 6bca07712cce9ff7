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

	"github.com/google/go-cmp/cmp"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// TestRecordsReachStderrFileAndSocket proves one record goes to all three outputs,
// that the level filters, and that a missing socket is not an error.
func TestRecordsReachStderrFileAndSocket(t *testing.T) {
	dir := shortdir.New(t)
	sock := filepath.Join(dir, "pseq.sock")
	msgs := listenAgent(t, "unixpacket", sock)
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
	msg := receive(t, msgs)
	var rec map[string]any
	if err := json.Unmarshal(msg, &rec); err != nil || rec["decision"] != "redirect" {
		t.Errorf("socket message = %q (%v)", msg, err)
	}
	New(&stderr, Options{Socket: filepath.Join(dir, "absent.sock")}).Info("no agent")
}

// TestLogFileStaysWithinItsBound: however many plugin runs append to it, the file and
// its one rotated predecessor stay under 2 x MaxFileBytes, and the newest records are
// in the file.
func TestLogFileStaysWithinItsBound(t *testing.T) {
	path := filepath.Join(shortdir.New(t), "istio-cni.log")
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

// TestReportReachesTheAgentWhateverTheLevel: an event goes out as one message of
// its own even when the level hides every record, and reads back as an event,
// while a log record does not.
func TestReportReachesTheAgentWhateverTheLevel(t *testing.T) {
	sock := filepath.Join(shortdir.New(t), "pseq.sock")
	msgs := listenAgent(t, "unixpacket", sock)
	l := New(io.Discard, Options{Level: slog.LevelError, Socket: sock})
	l.Info("hidden")
	want := Event{Command: "ADD", Outcome: OutcomeFailed, Reason: ReasonApply, Seconds: 0.25}
	l.Report(want)
	l.Close()
	msg := receive(t, msgs)
	got, ok := ParseEvent(msg)
	if !ok || got != want {
		t.Errorf("message %s read as %+v %v, want %+v", msg, got, ok, want)
	}
	if _, ok := ParseEvent([]byte(`{"time":"t","level":"INFO","msg":"ADD","event":"x"}`)); ok {
		t.Error("a log record with an event field read as an event")
	}
	// No agent: nothing is sent and nothing fails.
	New(io.Discard, Options{Socket: filepath.Join(shortdir.New(t), "absent.sock")}).Report(want)
}

// TestAStuckAgentCostsAtMostSendBound: an agent that stopped reading (it never
// accepts the connection, or, of an earlier build, its datagram queue is full)
// costs the whole plugin run at most SendBound, however many records it sends:
// once the socket's buffer is full, the run waits out what is left of the bound
// and sends nothing more. The check allows for a loaded machine (200 ms over the
// bound for 5000 Reports in all, a wait of SendBound without it); the time is
// logged.
func TestAStuckAgentCostsAtMostSendBound(t *testing.T) {
	for _, network := range []string{"unixpacket", "unixgram"} {
		t.Run(network, func(t *testing.T) {
			sock := filepath.Join(shortdir.New(t), "agent.sock")
			var err error
			if network == "unixpacket" {
				var ln *net.UnixListener
				ln, err = net.ListenUnix(network, &net.UnixAddr{Name: sock, Net: network}) // never accepts
				defer ln.Close()
			} else {
				var c *net.UnixConn
				c, err = net.ListenUnixgram(network, &net.UnixAddr{Name: sock, Net: network}) // never reads
				defer c.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			l := New(io.Discard, Options{Socket: sock})
			defer l.Close()
			if l.events == nil {
				t.Fatal("no connection to the agent's socket")
			}
			e := Event{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 0.01}
			start := time.Now()
			for range 5000 {
				l.Report(e)
			}
			took := time.Since(start)
			if l.events.left > 0 {
				t.Fatalf("5000 Reports never filled the socket's buffer (%s of the bound left): the test did not see a stuck agent", l.events.left)
			}
			if took > SendBound+timingSlack*time.Millisecond {
				t.Errorf("5000 Reports to a stuck agent took %s, bound %s", took, SendBound)
			}
			t.Logf("5000 Reports to a stuck agent took %s (bound %s)", took, SendBound)
		})
	}
}

// TestTheAgentsSocketOfEachBuildIsFound: the plugin sends to whatever agent the
// node runs: this build's (SOCK_SEQPACKET at Socket); an earlier build's whose
// entry names its datagram socket (Socket is a datagram socket); an earlier
// build's on a node rolled back to it while the entry names this build's socket
// (nothing at Socket, a datagram socket at DatagramSocket).
func TestTheAgentsSocketOfEachBuildIsFound(t *testing.T) {
	for _, tc := range []struct {
		name          string
		listen        string // the socket the agent listens on: "socket" or "datagram"
		network, want string
	}{
		{"this build's agent", "socket", "unixpacket", "unixpacket"},
		{"an earlier agent, its entry", "socket", "unixgram", "unixgram"},
		{"an earlier agent, this build's entry", "datagram", "unixgram", "unixgram"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortdir.New(t) // a subtest's TempDir can be too long for a socket path
			o := Options{Socket: filepath.Join(dir, "pseq.sock"), DatagramSocket: filepath.Join(dir, "plog.sock")}
			path := o.Socket
			if tc.listen == "datagram" {
				path = o.DatagramSocket
			}
			msgs := listenAgent(t, tc.network, path)
			l := New(io.Discard, o)
			l.Report(Event{Command: "ADD", Outcome: OutcomeRedirected})
			l.Close()
			if got := l.events.c.LocalAddr().Network(); got != tc.want {
				t.Errorf("sent over %s, want %s", got, tc.want)
			}
			if e, ok := ParseEvent(receive(t, msgs)); !ok || e.Outcome != OutcomeRedirected {
				t.Errorf("the agent got %+v", e)
			}
		})
	}
}

// listenAgent listens at path as an agent does, on network: "unixpacket" (a
// SOCK_SEQPACKET socket, as this build's agent) or "unixgram" (a datagram socket,
// as agents of earlier builds), and returns the messages of every connection.
func listenAgent(t testing.TB, network, path string) <-chan []byte {
	t.Helper()
	addr := &net.UnixAddr{Name: path, Net: network}
	msgs := make(chan []byte, 100)
	if network == "unixgram" {
		c, err := net.ListenUnixgram(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go readMessages(c, msgs)
		return msgs
	}
	ln, err := net.ListenUnix(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go readMessages(c, msgs)
		}
	}()
	return msgs
}

// readMessages sends every message read from c to msgs until c ends.
func readMessages(c net.Conn, msgs chan<- []byte) {
	defer c.Close()
	for {
		buf := make([]byte, 64<<10)
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		msgs <- buf[:n]
	}
}

func receive(t *testing.T, msgs <-chan []byte) []byte {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("nothing reached the agent's socket within 5 s")
		return nil
	}
}

// TestUnderIstiosAgentTheRecordsArePostedInIstiosFormat: on a node where Istio's
// agent runs (its log.sock, no plog.sock), the records are posted at Close as
// Istio's plugin posts them, and they pass the checks Istio's agent makes
// (cni/pkg/log/uds.go: a JSON array of strings, each a JSON object with a string
// msg, a level among debug/info/warn/error in lower case, an RFC 3339 time).
func TestUnderIstiosAgentTheRecordsArePostedInIstiosFormat(t *testing.T) {
	dir := shortdir.New(t)
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
// JSON encoding and one message, on this build's SOCK_SEQPACKET socket and on an
// earlier build's datagram socket.
func BenchmarkReport(b *testing.B) {
	for _, network := range []string{"unixpacket", "unixgram"} {
		b.Run(network, func(b *testing.B) {
			sock := filepath.Join(b.TempDir(), "agent.sock")
			msgs := listenAgent(b, network, sock)
			go func() {
				for range msgs {
				}
			}()
			l := New(io.Discard, Options{Socket: sock})
			defer l.Close()
			e := Event{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 0.0123}
			for b.Loop() {
				l.events.left = SendBound // one run's bound per Report: b.Loop runs many
				l.Report(e)
			}
		})
	}
}

// BenchmarkConnect is what finding the agent costs each plugin run: the connect
// to its socket and the close.
func BenchmarkConnect(b *testing.B) {
	sock := filepath.Join(b.TempDir(), "agent.sock")
	msgs := listenAgent(b, "unixpacket", sock)
	go func() {
		for range msgs {
		}
	}()
	for b.Loop() {
		New(io.Discard, Options{Socket: sock}).Close()
	}
}

// TestEventJSONIsEncodingJSONs: the event the plugin writes by hand decodes to the
// same JSON value as encoding/json's encoding of it, and ParseEvent reads it back.
func TestEventJSONIsEncodingJSONs(t *testing.T) {
	for _, e := range []Event{
		{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 0.004123},
		{Command: "ADD", Outcome: OutcomeFailed, Reason: ReasonPodLookup, Seconds: 12.5},
		{Command: "ADD", Outcome: OutcomePassedThrough, Seconds: 0},
		{Command: "A\"D\\D\n", Outcome: "\xff\u2028", Seconds: 1e-9},
		{Command: "ADD", Outcome: OutcomeRedirected, Seconds: 123456789.125},
	} {
		got := e.appendJSON(nil)
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var gotV, wantV any
		if err := json.Unmarshal(got, &gotV); err != nil {
			t.Fatalf("%+v: wrote %s, not JSON: %v", e, got, err)
		}
		if err := json.Unmarshal(want, &wantV); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantV, gotV); diff != "" {
			t.Errorf("%+v: %s against encoding/json's %s (-want +got):\n%s", e, got, want, diff)
		}
		back, ok := ParseEvent(got)
		if !ok || back.Seconds != e.Seconds || back.Reason != e.Reason {
			t.Errorf("%+v: ParseEvent(%s) = %+v, %v", e, got, back, ok)
		}
	}
}
