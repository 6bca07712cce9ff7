// Package pluginlog sets up the plugin's logging. The plugin's stdout carries only its
// CNI result, so logs go to stderr (the runtime's journal), optionally to a file, and
// to the node agent's log socket when it exists, so that `kubectl logs` of the agent
// shows every ADD/DEL decision.
package pluginlog

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/istio-cni/istio-cni/internal/http1"
	"github.com/istio-cni/istio-cni/internal/jsontree"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// Options say where logs go besides stderr.
type Options struct {
	Level slog.Level
	// File, when set, receives the same records (appended).
	File string
	// Socket, when set and present, is the agent's log socket: a unix SOCK_SEQPACKET
	// socket, each record one message on the plugin's own connection, so that none is
	// lost however many plugins send at once; or, from an agent of an earlier build,
	// a unix datagram socket, each record one datagram. Sending costs the plugin at
	// most SendBound in all; a missing, dead or stuck agent never holds it up longer.
	Socket string
	// DatagramSocket is the datagram socket of agents of earlier builds (plog.sock),
	// tried when Socket does not answer: a node rolled back to such an agent, whose
	// entry still names Socket while its agent listens here.
	DatagramSocket string
	// JSON writes stderr as JSON lines (the file and the socket always are).
	JSON bool
	// IstioSocket is where Istio's node agent takes its plugin's log lines (HTTP on
	// a unix socket). Used only when Socket is set but absent and IstioSocket
	// exists, i.e. on a node where Istio's agent runs instead of ours (a switch
	// back): the records are then posted there at Close, in Istio's format, as
	// Istio's plugin does, within IstioPostBound.
	IstioSocket string
}

// IstioPostBound bounds the post of the records to Istio's agent at Close (its own
// plugin's client gives up after 1 s too).
const IstioPostBound = time.Second

// IstioLogPath is the HTTP path Istio's agent takes its plugin's log lines on.
const IstioLogPath = "/log"

// New returns the logger and a function that closes its outputs.
func New(stderr io.Writer, o Options) *Logger {
	hopts := &slog.HandlerOptions{Level: o.Level}
	var handlers []slog.Handler
	if o.JSON {
		handlers = append(handlers, slog.NewJSONHandler(stderr, hopts))
	} else {
		handlers = append(handlers, slog.NewTextHandler(stderr, hopts))
	}
	var closers []io.Closer
	var events *agentWriter
	var notRegular error
	if o.File != "" {
		if f, err := openBounded(o.File); err == nil {
			handlers = append(handlers, slog.NewJSONHandler(f, hopts))
			closers = append(closers, f)
		} else if errors.Is(err, regularfile.ErrNotRegular) {
			notRegular = err
		}
	}
	if o.Socket != "" {
		if w := dialAgent(o.Socket, o.DatagramSocket); w != nil {
			events = w
			handlers = append(handlers, slog.NewJSONHandler(events, hopts))
			closers = append(closers, w.c)
		} else if st, err := os.Stat(o.IstioSocket); o.IstioSocket != "" && err == nil && st.Mode().Type() == os.ModeSocket {
			p := &istioPoster{socket: o.IstioSocket}
			handlers = append(handlers, slog.NewJSONHandler(p, &slog.HandlerOptions{Level: o.Level, ReplaceAttr: istioLevel}))
			closers = append(closers, p)
		}
	}
	l := &Logger{Logger: slog.New(fanout(handlers)), closers: closers, events: events}
	if notRegular != nil {
		l.Warn(`log_file is not a regular file: the records go to stderr and the agent only (set log_file to "" for no file)`, "error", notRegular)
	}
	return l
}

// MaxFileBytes bounds the log file (it lives in the agent's run dir, a tmpfs, so in
// node memory): a file that reached it is moved to <file>.1, replacing the previous
// one, and a new file is started. The two hold at most 2 x MaxFileBytes. One ADD
// writes a few hundred bytes, so 5 MiB is the last ten thousand or so.
const MaxFileBytes = 5 << 20

// openBounded opens path for appending, first rotating it when it is full. Plugins
// run concurrently: two may rotate at once, which loses at most one rotated file's
// older lines, never the bound. Only a regular file (or a symbolic link to one) is
// used, anything else is refused with regularfile.ErrNotRegular: it is opened without
// blocking, since a FIFO no one reads would block the open until a reader came,
// and one with a reader would block the writes once its buffer is full.
func openBounded(path string) (*os.File, error) {
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Size() >= MaxFileBytes {
		_ = os.Rename(path, path+".1")
	}
	return regularfile.Open(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// Logger is a slog.Logger that owns its outputs.
type Logger struct {
	*slog.Logger
	closers []io.Closer
	// events is the agent's socket, nil when there is none.
	events *agentWriter
}

// Event is the outcome of one plugin command, sent to the agent for its metrics
// whatever the log level. It travels on the log socket as one message of its own:
// a JSON object with "event" and no "msg", which tells it from a log record.
type Event struct {
	// Command is ADD (the only one reported today).
	Command string `json:"event"`
	// Outcome is one of the Outcome* values.
	Outcome string `json:"outcome"`
	// Reason is the failed step (one of the Reason* values) when Outcome is
	// OutcomeFailed.
	Reason string `json:"reason,omitempty"`
	// Seconds is the command's run time in the plugin, from its start to its
	// result.
	Seconds float64 `json:"seconds"`
}

// Outcomes of an ADD.
const (
	OutcomeRedirected    = "redirected"
	OutcomePassedThrough = "passed_through"
	OutcomeFailed        = "failed"
)

// Reasons an ADD failed: the step that failed. The agent counts each by name, so
// the list is closed: Reasons holds every one.
const (
	ReasonConfig      = "config"       // the network config on stdin
	ReasonPrevResult  = "prev_result"  // the previous plugin's result
	ReasonCNIArgs     = "cni_args"     // a CNI_ARGS pair is not KEY=VALUE
	ReasonPodLookup   = "pod_lookup"   // the pod (or its namespace) could not be read
	ReasonPodSettings = "pod_settings" // the pod's annotations or the config make no valid plan
	ReasonBackend     = "backend"      // the rule backend could not be set up
	ReasonApply       = "apply"        // programming the rules in the pod's netns failed
	ReasonNetnsGone   = "netns_gone"   // the pod's netns disappeared during the ADD
	ReasonOutput      = "output"       // the result could not be printed
	ReasonEnvironment = "environment"  // the runtime's CNI_NETNS is the plugin's own namespace
)

// Reasons lists every Reason*, for the agent to pre-create its series.
var Reasons = []string{ReasonConfig, ReasonPrevResult, ReasonCNIArgs, ReasonPodLookup, ReasonPodSettings,
	ReasonBackend, ReasonApply, ReasonNetnsGone, ReasonOutput, ReasonEnvironment}

// Report sends e to the agent: one message, within what is left of SendBound,
// dropped when there is no agent. The ADD's result does not depend on it.
func (l *Logger) Report(e Event) {
	if l.events == nil {
		return
	}
	_, _ = l.events.Write(e.appendJSON(nil))
}

// appendJSON writes e as encoding/json would (TestEventJSONIsEncodingJSONs),
// without its reflection: the plugin sends one event per ADD, and encoding/json's
// first encode in a process costs more than the send.
func (e Event) appendJSON(b []byte) []byte {
	b = append(b, `{"event":`...)
	b = jsontree.AppendString(b, e.Command)
	b = append(b, `,"outcome":`...)
	b = jsontree.AppendString(b, e.Outcome)
	if e.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsontree.AppendString(b, e.Reason)
	}
	b = append(b, `,"seconds":`...)
	if math.IsNaN(e.Seconds) || math.IsInf(e.Seconds, 0) {
		b = append(b, '0') // encoding/json refuses these; a run time never is one
	} else {
		b = strconv.AppendFloat(b, e.Seconds, 'g', -1, 64)
	}
	return append(b, '}')
}

// ParseEvent reads a message from the log socket: ok is false for a log record.
func ParseEvent(datagram []byte) (e Event, ok bool) {
	var probe struct {
		Event *string          `json:"event"`
		Msg   *json.RawMessage `json:"msg"`
	}
	if json.Unmarshal(datagram, &probe) != nil || probe.Event == nil || probe.Msg != nil {
		return Event{}, false
	}
	if json.Unmarshal(datagram, &e) != nil {
		return Event{}, false
	}
	return e, true
}

// Close closes the file and socket outputs.
func (l *Logger) Close() error {
	var errs []error
	for _, c := range l.closers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// SendBound bounds all the time one plugin run waits for the agent's socket: the
// waits of every record's write together. Each record is first written without
// waiting, which a live agent's socket takes at once (a connection's socket buffer,
// about 200 KiB, holds far more than one run's records, even before the agent
// accepts the connection; a run delayed by the machine's load loses nothing to the
// bound). Only a write to a full socket, an agent that stopped reading, waits, for
// what is left of the bound; once it is spent the run sends nothing more. The
// connect never waits: a unix socket's connect succeeds or fails at once (an
// agent's full accept queue fails it).
const SendBound = 5 * time.Millisecond

// agentWriter sends each Write (one JSON record) as one message to the agent,
// waiting at most what is left of SendBound, dropping it when nothing is left.
type agentWriter struct {
	c   net.Conn
	raw syscall.RawConn
	mu  sync.Mutex // records and reports may be written from several goroutines
	// left is what remains of SendBound; 0 after a failed write (the agent
	// is gone or stuck: the run sends nothing more).
	left time.Duration
}

// dialAgent connects to the agent's log socket: its SOCK_SEQPACKET socket at
// packet; a datagram socket there (an agent of an earlier build, whose entry named
// it); the datagram socket of such an agent at datagram (a node rolled back to it
// while its entry still names packet). Nil when none answers.
func dialAgent(packet, datagram string) *agentWriter {
	for _, t := range []struct{ network, path string }{{"unixpacket", packet}, {"unixgram", packet}, {"unixgram", datagram}} {
		if t.path == "" {
			continue
		}
		c, err := net.Dial(t.network, t.path)
		if err != nil {
			continue
		}
		raw, err := c.(*net.UnixConn).SyscallConn()
		if err != nil {
			c.Close()
			continue
		}
		return &agentWriter{c: c, raw: raw, left: SendBound}
	}
	return nil
}

func (w *agentWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.left <= 0 {
		return len(p), nil
	}
	// Without waiting first (the socket is non-blocking): one write(2), one message.
	var werr error
	err := w.raw.Control(func(fd uintptr) {
		for {
			if _, werr = syscall.Write(int(fd), p); werr != syscall.EINTR {
				return
			}
		}
	})
	if err == nil {
		err = werr
	}
	if err == nil {
		return len(p), nil
	}
	if errors.Is(err, syscall.EAGAIN) { // the socket's buffer is full: wait, within the bound
		start := time.Now()
		w.c.SetWriteDeadline(start.Add(w.left))
		_, err = w.c.Write(p)
		w.left -= time.Since(start)
	}
	if err != nil {
		w.left = 0 // the agent is gone or stuck; logging must not fail the plugin
	}
	return len(p), nil
}

// istioLevel writes the level as Istio's agent reads it: lower case ("warn"),
// else it drops the line.
func istioLevel(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.LevelKey {
		return slog.String(slog.LevelKey, strings.ToLower(a.Value.String()))
	}
	return a
}

// istioPoster collects the JSON records and posts them to Istio's agent at Close:
// POST /log with a JSON array of the records, each a string.
type istioPoster struct {
	socket  string
	records []string
}

func (p *istioPoster) Write(b []byte) (int, error) {
	p.records = append(p.records, strings.TrimSpace(string(b)))
	return len(b), nil
}

func (p *istioPoster) Close() error {
	if len(p.records) == 0 {
		return nil
	}
	body, err := json.Marshal(p.records)
	if err != nil {
		return nil
	}
	conn, err := net.DialTimeout("unix", p.socket, IstioPostBound)
	if err != nil {
		return nil
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(IstioPostBound))
	_, _ = http1.Do(conn, http1.Request{Method: "POST", Host: "unix", Path: IstioLogPath,
		Header: [][2]string{{"Content-Type", "application/json"}}, Body: body}, 1<<20)
	return nil // the agent may be gone; logging must not fail the plugin
}

type fanout []slog.Handler

func (f fanout) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range f {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (f fanout) Handle(ctx context.Context, r slog.Record) error {
	// Times are written in UTC, as the node's other components write them; a
	// local time would also cost every run a read of the zone database.
	r.Time = r.Time.UTC()
	var errs []error
	for _, h := range f {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (f fanout) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithAttrs(attrs)
	}
	return out
}

func (f fanout) WithGroup(name string) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithGroup(name)
	}
	return out
}
