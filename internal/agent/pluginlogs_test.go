package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/nofile"
	"github.com/istio-cni/istio-cni/test/harness/poll"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// TestNoPluginRecordIsLostInABurst: 500 plugin runs at once (the plugin's own
// logging code, one goroutine each: what 500 plugin processes do to the socket),
// each logging one record and reporting its ADD, reach the agent's plugin log
// server, every record and every report: with datagrams (net.unix.max_dgram_qlen
// of 10 on the whole socket) some were dropped. Half the runs are plugins of this
// build, half of an earlier build whose entry names the datagram socket: an
// upgrade's mix, which the agent serves both of. What an earlier build's plugin
// sends through the datagram socket may still be dropped under such a burst, so
// its half is checked with as many runs as the socket's queue holds, one at a time.
func TestNoPluginRecordIsLostInABurst(t *testing.T) {
	dir := shortdir.New(t) // sockets go in it
	packet, dgram := filepath.Join(dir, plugin.LogSocketName), filepath.Join(dir, plugin.DatagramLogSocketName)
	var out logbuf.Buffer
	sink := &pluginLogSink{out: &out, m: newMetrics()}
	stop, err := servePluginLogs(packet, dgram, sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop(time.Now().Add(PluginLogDrainBound))

	const burst, earlier = 500, 50
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			l := pluginlog.New(io.Discard, pluginlog.Options{Level: slog.LevelInfo, Socket: packet, DatagramSocket: dgram})
			l.Info("ADD: pod redirected", "pod", fmt.Sprintf("apps/web-%d", i))
			l.Report(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomeRedirected, Seconds: 0.01})
			l.Close()
		})
	}
	wg.Wait()
	m := sink.m
	counts := func() (seq, dg, redirected, passed float64) {
		return gathered(t, m, "istio_cni_plugin_log_records_total", "protocol", protocolSeqpacket),
			gathered(t, m, "istio_cni_plugin_log_records_total", "protocol", protocolDatagram),
			gathered(t, m, "istio_cni_plugin_events_total", "outcome", pluginlog.OutcomeRedirected),
			gathered(t, m, "istio_cni_plugin_events_total", "outcome", pluginlog.OutcomePassedThrough)
	}
	waitFor := func(wantSeq, wantDgram float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			seq, dg, redirected, passed := counts()
			if seq == wantSeq && dg == wantDgram && redirected == wantSeq && passed == wantDgram {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("within 10 s the agent got records: %v of %v over SOCK_SEQPACKET, %v of %v as datagrams; reports: %v of %v redirected ADDs, %v of %v passed through",
					seq, wantSeq, dg, wantDgram, redirected, wantSeq, passed, wantDgram)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(burst, 0)
	// Once the burst is read, and one plugin at a time: a datagram queue holds 10
	// (net.unix.max_dgram_qlen), and a plugin drops what it cannot send within
	// pluginlog.SendBound, so plugins of earlier builds lose records to an agent
	// that lags, as they always did (one CI run lost one report of 50 sent in a
	// row while the machine was busy). What is checked here is that the agent
	// reads and counts them.
	for i := range earlier {
		l := pluginlog.New(io.Discard, pluginlog.Options{Level: slog.LevelInfo, Socket: dgram}) // an earlier build's entry
		l.Info("ADD: pod passed through", "pod", fmt.Sprintf("kube-system/dns-%d", i))
		l.Report(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomePassedThrough, Seconds: 0.01})
		l.Close()
		waitFor(burst, float64(i+1))
	}
	lines := out.String()
	for i := range burst {
		if !strings.Contains(lines, fmt.Sprintf(`"pod":"apps/web-%d"`, i)) {
			t.Errorf("the record of apps/web-%d is not on the agent's stdout", i)
		}
	}
	if got := strings.Count(lines, "\n"); got != burst+earlier {
		t.Errorf("%d lines on the agent's stdout, want %d", got, burst+earlier)
	}
	// The latency histogram counts every ADD too.
	counted := gathered(t, m, "istio_cni_plugin_add_duration_seconds", "outcome", pluginlog.OutcomeRedirected)
	if counted != burst {
		t.Errorf("the ADD latency histogram counts %v redirected ADDs, want %d", counted, burst)
	}
}

// gathered is the value of family's series whose label is value, from the agent's
// registry: a counter's value or a histogram's count; with label "", the series
// without labels (a gauge's value too).
func gathered(t *testing.T, m *metrics, family, label, value string) float64 {
	t.Helper()
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, s := range f.GetMetric() {
			if label == "" && len(s.GetLabel()) == 0 { // a series without labels
				if g := s.GetGauge(); g != nil {
					return g.GetValue()
				}
				return s.GetCounter().GetValue()
			}
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if h := s.GetHistogram(); h != nil {
						return float64(h.GetSampleCount())
					}
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", family, label, value)
	return 0
}

// TestPluginRecordsPrintAsOneJSONLineEach: whatever a plugin sends, each message
// is one line of valid JSON on the agent's stdout: a record spread over lines is
// compacted, a message that is not JSON (or forges a second record after a
// newline) and one over maxRecord (cut by the socket) become warning records
// quoting their start.
func TestPluginRecordsPrintAsOneJSONLineEach(t *testing.T) {
	dir := shortdir.New(t)
	packet, dgram := filepath.Join(dir, plugin.LogSocketName), filepath.Join(dir, plugin.DatagramLogSocketName)
	var out logbuf.Buffer
	sink := &pluginLogSink{out: &out, m: newMetrics()}
	stop, err := servePluginLogs(packet, dgram, sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop(time.Now().Add(PluginLogDrainBound))
	big, _ := json.Marshal(map[string]string{"level": "INFO", "msg": "ADD: big", "blob": strings.Repeat("x", 70<<10)})
	sent := []struct {
		msg  string
		want string // in the line printed for it
	}{
		{`{"level":"INFO","msg":"ok"}`, `{"level":"INFO","msg":"ok"}`},
		{"{\"level\":\"INFO\",\n  \"msg\":\"spread\"}", `{"level":"INFO","msg":"spread"}`},
		{"not json\n{\"level\":\"ERROR\",\"msg\":\"forged\"}", `"msg":"a plugin log record that is not JSON"`},
		{string(big), `"msg":"a plugin log record over the 65536 bytes the agent reads, cut"`},
	}
	for _, s := range sent {
		c, err := net.Dial("unixpacket", packet)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(s.msg)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		lines = strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if len(lines) >= len(sent) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(lines) != len(sent) {
		t.Fatalf("%d messages printed as %d lines:\n%s", len(sent), len(lines), out.String())
	}
	// Each message on its own connection: served at once, in any order.
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("printed a line that is not JSON: %.200q", l)
		}
	}
	for i, s := range sent {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, s.want) }) {
			t.Errorf("message %d: no line holds %s:\n%.2000s", i, s.want, out.String())
		}
	}
}

// TestStoppingLeavesAnotherAgentsSocket: an agent that stops removes its sockets
// only while they are still its own; another agent that took the paths since (the
// run dir is shared during an upgrade or a switch of DaemonSets) keeps its live ones.
func TestStoppingLeavesAnotherAgentsSocket(t *testing.T) {
	dir := shortdir.New(t)
	packet, dgram, istio := filepath.Join(dir, "p.sock"), filepath.Join(dir, "d.sock"), filepath.Join(dir, "i.sock")
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	serve := func() func() {
		sink := &pluginLogSink{out: io.Discard, m: newMetrics()}
		stopPlugin, err := servePluginLogs(packet, dgram, sink, discard)
		if err != nil {
			t.Fatal(err)
		}
		stopIstio, err := serveIstioPluginLogs(istio, sink, discard)
		if err != nil {
			t.Fatal(err)
		}
		return func() {
			stopPlugin(time.Now().Add(PluginLogDrainBound))
			stopIstio(time.Now().Add(PluginLogDrainBound))
		}
	}
	stopOld := serve()
	stopNew := serve() // takes the paths over
	stopOld()
	for _, p := range []string{packet, dgram, istio} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("the old agent's stop removed the new agent's %s: %v", filepath.Base(p), err)
		}
	}
	stopNew()
	for _, p := range []string{packet, dgram, istio} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the new agent's stop left its own %s", filepath.Base(p))
		}
	}
}

// TestHTTPServersAreBounded: the metrics and probe servers, on the node's network,
// are built with bounds on reading, writing and a kept-alive connection's idle
// wait. It checks the settings only: net/http's own tests prove what they do, and
// waiting out a 30 s idle bound here would slow every run.
func TestHTTPServersAreBounded(t *testing.T) {
	s := newHTTPServer(http.NotFoundHandler(), slog.Default())
	if s.ReadHeaderTimeout == 0 || s.ReadTimeout == 0 || s.WriteTimeout == 0 || s.IdleTimeout == 0 {
		t.Errorf("server bounds: header %s, read %s, write %s, idle %s; want all set", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
}

// TestPluginLogsAreServedAfterTheAgentRanOutOfFiles: while the agent is out of file
// descriptors (EMFILE, its RLIMIT_NOFILE reached), accepting a plugin's connection
// fails; once descriptors are free again, that plugin's records and every later
// plugin's reach the agent's stdout. Before, the first failed accept ended the
// accept loop for good: every later plugin's connection waited in the socket's
// queue unread, its records and ADD reports lost, until the agent restarted.
func TestPluginLogsAreServedAfterTheAgentRanOutOfFiles(t *testing.T) {
	dir := shortdir.New(t)
	packet, dgram := filepath.Join(dir, plugin.LogSocketName), filepath.Join(dir, plugin.DatagramLogSocketName)
	var out, agentLog logbuf.Buffer
	sink := &pluginLogSink{out: &out, m: newMetrics()}
	stop, err := servePluginLogs(packet, dgram, sink, slog.New(slog.NewTextHandler(&agentLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop(time.Now().Add(PluginLogDrainBound))

	// The plugin's socket is made before the process runs out: its connection
	// takes no descriptor, and the agent's accept has none.
	during := nofile.NewSocket(t, syscall.AF_UNIX, syscall.SOCK_SEQPACKET)
	release := nofile.Exhaust(t, 0)
	if err := during.Connect(&syscall.SockaddrUnix{Name: packet}); err != nil {
		release()
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, 10*time.Millisecond, "the agent's accept fails with EMFILE", func() bool {
		return strings.Contains(agentLog.String(), "too many open files")
	})
	release()

	if err := during.Write([]byte(`{"level":"INFO","msg":"sent by a plugin that connected while the agent had no descriptor"}`)); err != nil {
		t.Fatal(err)
	}
	during.Close()
	l := pluginlog.New(io.Discard, pluginlog.Options{Level: slog.LevelInfo, Socket: packet, DatagramSocket: dgram})
	l.Info("sent by a plugin that connected once descriptors were free")
	l.Report(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomeRedirected, Seconds: 0.01})
	l.Close()

	deadline := time.Now().Add(10 * time.Second)
	for {
		lines := out.String()
		if strings.Contains(lines, "while the agent had no descriptor") && strings.Contains(lines, "once descriptors were free") &&
			gathered(t, sink.m, "istio_cni_plugin_events_total", "outcome", pluginlog.OutcomeRedirected) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the agent had descriptors again, its stdout holds:\n%s\nand it counted %v redirected ADDs, want both records and 1; the agent's log:\n%s",
				lines, gathered(t, sink.m, "istio_cni_plugin_events_total", "outcome", pluginlog.OutcomeRedirected), agentLog.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scriptedReads is a datagramReader that returns its reads in order, then
// net.ErrClosed.
type scriptedReads struct {
	reads []scriptedRead
}

type scriptedRead struct {
	data string
	err  error
}

func (s *scriptedReads) ReadFromUnix(b []byte) (int, *net.UnixAddr, error) {
	if len(s.reads) == 0 {
		return 0, nil, net.ErrClosed
	}
	r := s.reads[0]
	s.reads = s.reads[1:]
	if r.err != nil {
		return 0, nil, r.err
	}
	return copy(b, r.data), nil, nil
}

// TestTheDatagramReaderOutlivesATransientError: a read error other than the
// socket's closing (ENOBUFS, ENOMEM) is logged and the read tried again, so the
// records after it still reach the agent's stdout. Before, the first such error
// ended the reader for good while the agent stayed ready. A closed socket, or
// stop during the wait, still ends it.
func TestTheDatagramReaderOutlivesATransientError(t *testing.T) {
	var out, logged logbuf.Buffer
	sink := &pluginLogSink{out: &out, m: newMetrics()}
	r := &scriptedReads{reads: []scriptedRead{
		{data: `{"level":"INFO","msg":"before"}`},
		{err: syscall.ENOBUFS},
		{err: syscall.ENOMEM},
		{data: `{"level":"INFO","msg":"after"}`},
	}}
	readDatagrams(r, make(chan struct{}), sink, slog.New(slog.NewTextHandler(&logged, nil)))
	for _, msg := range []string{`"before"`, `"after"`} {
		if !strings.Contains(out.String(), msg) {
			t.Errorf("record %s not written; stdout:\n%s", msg, out.String())
		}
	}
	if got := strings.Count(logged.String(), "read failed"); got != 2 {
		t.Errorf("logged %d read failures, want 2:\n%s", got, logged.String())
	}

	// Stop while it waits to read again: it returns.
	done := make(chan struct{})
	close(done)
	r = &scriptedReads{reads: []scriptedRead{{err: syscall.ENOBUFS}, {data: `{"msg":"never"}`}}}
	readDatagrams(r, done, sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if strings.Contains(out.String(), "never") {
		t.Errorf("a record was read after stop")
	}
}

// TestTheHTTPServersLogThroughTheAgentsLog: what net/http logs of the metrics and
// probe servers (an accept that fails, retried every 5 ms doubling to 1 s while the
// agent is out of descriptors) went to the standard library's logger: plain lines
// on stderr, outside the agent's format (JSON with --log_as_json), that a log
// pipeline parsing the agent's JSON could not read. They are the agent's records now.
func TestTheHTTPServersLogThroughTheAgentsLog(t *testing.T) {
	var agentLog logbuf.Buffer
	a := newAgent(&Settings{}, slog.New(slog.NewJSONHandler(&agentLog, nil)))
	stop, err := a.serveHTTP()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var addr string
	for _, line := range strings.Split(agentLog.String(), "\n") {
		var rec struct{ Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Addr != "" {
			addr = rec.Addr
			break
		}
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("no server address in the agent's log (%v):\n%s", err, agentLog.String())
	}

	portNum, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	// The client's socket is made before the process runs out: its connection
	// takes no descriptor, and the server's accept has none.
	c := nofile.NewSocket(t, syscall.AF_INET, syscall.SOCK_STREAM)
	release := nofile.Exhaust(t, 0)
	if err := c.Connect(&syscall.SockaddrInet4{Port: portNum, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		release()
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(agentLog.String(), "too many open files") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	release()
	if !strings.Contains(agentLog.String(), "too many open files") {
		t.Fatalf("the server's failed accept is not in the agent's log:\n%s", agentLog.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(agentLog.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line of the agent's JSON log is not JSON: %s", line)
		}
	}
}
