package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/istio-cni/istio-cni/internal/ownfile"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/unixsock"
)

// The agent reads the plugin's log records on three sockets in its run dir:
//
//   - pseq.sock (unix SOCK_SEQPACKET): this project's plugin. Each plugin run
//     connects and sends one JSON record or event (pluginlog.Event) per message.
//     Unlike datagrams (at most net.unix.max_dgram_qlen, 10, queued on the whole
//     socket, the rest dropped or waited for), each connection queues up to its
//     socket buffer, so a burst of ADDs loses nothing and no plugin waits;
//   - plog.sock (unix datagrams): the plugins of earlier builds, whose entry names
//     it, during an upgrade; this plugin too when it finds no pseq.sock;
//   - log.sock (unix stream, HTTP): Istio's plugin, which POSTs /log with a JSON
//     array of JSON-encoded records at the end of each command.
//
// All end up on the agent's stdout, one JSON line per record, so that during an
// upgrade, or a switch between Istio's DaemonSet and this one, a plugin of the
// other kind that is still running loses no line.

// maxRecord bounds one message; the plugin's records are far smaller.
const maxRecord = 64 << 10

// MaxPluginConns bounds the plugin connections served at once (each holds a
// maxRecord buffer). Connections beyond it wait in the socket's accept queue
// (net.core.somaxconn, 4096 by default), their records queued in the kernel, and
// are served as others end; a plugin finding that queue full sends its records as
// datagrams to plog.sock instead.
const MaxPluginConns = 128

// pluginConnBound bounds one plugin connection: longer than a runtime lets a
// plugin run (the kubelet gives a CNI command 2 minutes), so that a plugin that
// hangs without exiting does not hold a slot for ever.
const pluginConnBound = 5 * time.Minute

// The wait before accepting again after an accept failed (net/http's server waits
// the same): doubling from acceptRetryMin to at most acceptRetryMax while it fails.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// pluginLogSink writes plugin records to the agent's stdout, one line each, whole
// lines only (records arrive on several goroutines), and counts them.
type pluginLogSink struct {
	mu  sync.Mutex
	out io.Writer
	m   *metrics
}

func (s *pluginLogSink) writeLine(rec []byte) {
	line := make([]byte, 0, len(rec)+1)
	line = append(append(line, rec...), '\n')
	s.mu.Lock()
	_, _ = s.out.Write(line)
	s.mu.Unlock()
}

// record takes one message from this project's plugin (any build): an event is
// counted, a log record printed, so that `kubectl logs` of the agent shows the
// plugin's decisions, and DEL outcomes counted. A message longer than maxRecord
// arrives cut (truncated): it is printed as a warning record holding its start.
func (s *pluginLogSink) record(rec []byte, protocol string, truncated bool) {
	rec = bytes.TrimRight(rec, "\r\n")
	if len(rec) == 0 {
		return
	}
	if !truncated {
		if e, ok := pluginlog.ParseEvent(rec); ok {
			s.m.pluginEvent(e)
			return
		}
	}
	s.m.pluginRecords.WithLabelValues(protocol).Inc()
	s.writeLine(oneLine(rec, truncated))
	if cmd, outcome, ok := classifyPluginRecord(rec); ok && !truncated {
		s.m.pluginEvents.WithLabelValues(cmd, outcome).Inc()
	}
}

// quotedStart is how much of a record that is cut or not JSON a warning quotes.
const quotedStart = 4 << 10

// oneLine is rec as one line of JSON on the agent's stdout: a JSON record
// compacted (a record spread over several lines, or with a newline between its
// members, would print as several, one of them looking like a record of its own);
// a record that is not JSON, or was cut at maxRecord, becomes a warning record
// quoting its start as a string.
func oneLine(rec []byte, truncated bool) []byte {
	if !truncated && json.Valid(rec) {
		if bytes.IndexAny(rec, "\r\n") < 0 {
			return rec
		}
		var b bytes.Buffer
		if json.Compact(&b, rec) == nil {
			return b.Bytes()
		}
	}
	msg := "a plugin log record that is not JSON"
	if truncated {
		msg = fmt.Sprintf("a plugin log record over the %d bytes the agent reads, cut", maxRecord)
	}
	start := rec[:min(len(rec), quotedStart)]
	line, _ := json.Marshal(struct {
		Level  string `json:"level"`
		Msg    string `json:"msg"`
		Bytes  int    `json:"bytes"`
		Record string `json:"record"`
	}{"WARN", msg, len(rec), string(start)})
	return line
}

// PluginLogDrainBound bounds the agent's stop of its plugin log servers, all
// together: what plugins sent before it is read and printed (connections in a
// socket's queue, datagrams queued, each served connection read to its end, an
// HTTP post answered), and what is still unread then is dropped. The agent stops
// them last of its exit, within the chart's 5 s grace period.
const PluginLogDrainBound = time.Second

// servePluginLogs serves this project's plugin's log sockets until stop is called:
// SOCK_SEQPACKET at packetPath, datagrams at datagramPath. stop removes the
// sockets (no plugin connects any more), reads what plugins sent before (each
// connection in the socket's queue, each one served, to its end; the datagrams
// queued) until deadline, then closes them and every connection and waits for
// their goroutines.
func servePluginLogs(packetPath, datagramPath string, sink *pluginLogSink, log *slog.Logger) (stop func(deadline time.Time), err error) {
	const what, whatDgram = "plugin log socket", "plugin datagram log socket"
	// Writable by root alone: the runtime running the plugin is root, and nobody
	// else may inject records. stop removes each, if the path is still ours
	// (ownfile).
	l, err := unixsock.Listen("unixpacket", packetPath, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ln := unixsock.NewDrainListener(l)
	packetFile, _ := os.Lstat(packetPath)
	dgram, err := unixsock.ListenPacket(datagramPath, 0o600)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s: %w", whatDgram, err)
	}
	datagramFile, _ := os.Lstat(datagramPath)

	var (
		wg    sync.WaitGroup // the accept loop and the readers
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		// Under mu: stop's deadline, zero until stop; each connection is read
		// until then at most.
		drainBy time.Time
		ended   bool // under mu: stop has closed conns; a later one is closed at once
		slots   = make(chan struct{}, MaxPluginConns)
		done    = make(chan struct{}) // closed when the drain's time is up
		drain   = make(chan struct{}) // closed when stop begins
		dgramWG sync.WaitGroup
	)
	dgramWG.Add(1)
	go func() {
		defer dgramWG.Done()
		readDatagrams(dgram, drain, sink, log.With("socket", whatDgram))
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		var backoff time.Duration
		for {
			select {
			case slots <- struct{}{}:
			case <-done:
				return
			}
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return // closed, or drained: the queue is empty
			}
			if err != nil {
				// Out of descriptors (EMFILE, ENFILE) or kernel memory: the
				// connection stays queued until an accept succeeds, so wait and
				// accept again, as net/http's server does; returning would leave
				// every later plugin's records unread until the agent restarts.
				<-slots
				if !waitToRetry(&backoff, done, log, what, err) {
					return
				}
				continue
			}
			backoff = 0
			mu.Lock()
			conns[c] = true
			if ended {
				c.Close() // its reader returns at once
			}
			if drainBy.IsZero() {
				c.SetReadDeadline(time.Now().Add(pluginConnBound))
			} else {
				c.SetReadDeadline(drainBy)
			}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
					<-slots
					wg.Done()
				}()
				buf := make([]byte, maxRecord+1) // as for datagrams: a cut message fills it
				for {
					n, err := c.Read(buf)
					if err != nil {
						return // io.EOF: the plugin is done
					}
					sink.record(buf[:min(n, maxRecord)], protocolSeqpacket, n > maxRecord)
				}
			}()
		}
	}()
	return func(deadline time.Time) {
		// Another agent sharing the run dir (an upgrade, a switch between Istio's
		// DaemonSet and this one) may have replaced them since: its live sockets
		// stay. Removed first: what reaches this agent's sockets from now on is
		// what plugins sent before.
		_ = ownfile.Remove(packetPath, packetFile)
		_ = ownfile.Remove(datagramPath, datagramFile)
		close(drain)
		ln.Drain()
		mu.Lock()
		drainBy = deadline
		for c := range conns {
			c.SetReadDeadline(deadline)
		}
		mu.Unlock()
		// The datagrams: the reader stops, the queue is read without waiting.
		dgram.SetReadDeadline(time.Unix(1, 0))
		dgramWG.Wait()
		buf := make([]byte, maxRecord+1)
		if _, err := unixsock.DrainDatagrams(dgram, buf, func(b []byte, n int) {
			sink.record(b[:min(len(b), maxRecord)], protocolDatagram, n > maxRecord)
		}); err != nil {
			log.Warn("the datagrams queued at stop were not all read", "socket", whatDgram, "error", err)
		}
		dgram.Close()
		// The connections: each queued one accepted, each read to its end.
		if !waitUntil(&wg, deadline) {
			close(done)
			mu.Lock()
			ended = true
			left := len(conns)
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			if left > 0 {
				log.Warn("plugin log connections still open at the end of the stop's bound closed: what their plugins log later reaches their stderr and log file only",
					"socket", what, "connections", left, "bound", PluginLogDrainBound)
			}
		}
		ln.Close()
		wg.Wait()
	}, nil
}

// waitUntil waits for wg until deadline, and says whether it was done by then.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) bool {
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-finished:
		return true
	case <-t.C:
		return false
	}
}

// pluginLogServers are the plugin log sockets the agent serves: this plugin's
// (servePluginLogs: the packet and datagram sockets) and Istio's plugin's
// (serveIstioPluginLogs). Only the agent's loop calls retake, and stop once the
// loop has ended.
type pluginLogServers struct {
	s       *Settings
	sink    *pluginLogSink
	log     *slog.Logger
	servers []*logServer
}

// logServer is one of them: what it is, the paths it listens on, how it starts,
// and the stop of the running one, which reads what plugins sent before it until
// deadline.
type logServer struct {
	what  string
	paths []string
	start func() (stop func(deadline time.Time), err error)
	stop  func(deadline time.Time)
}

// serve takes the sockets over: a socket at a path is a previous agent's.
func (p *pluginLogServers) serve() error {
	p.servers = []*logServer{
		{what: "the plugin log sockets", paths: []string{p.s.LogSocketPath(), p.s.DatagramLogSocketPath()},
			start: func() (func(time.Time), error) {
				return servePluginLogs(p.s.LogSocketPath(), p.s.DatagramLogSocketPath(), p.sink, p.log)
			}},
		{what: "Istio's plugin log socket", paths: []string{p.s.IstioLogSocketPath()},
			start: func() (func(time.Time), error) {
				return serveIstioPluginLogs(p.s.IstioLogSocketPath(), p.sink, p.log)
			}},
	}
	for i, srv := range p.servers {
		stop, err := srv.start()
		if err != nil {
			for _, started := range p.servers[:i] {
				started.stop(time.Now())
			}
			return err
		}
		srv.stop = stop
	}
	return nil
}

// retake serves anew the sockets whose path is gone (another agent that had taken
// them over removed them), then stops the servers they replace, which leave the
// new sockets in place (ownfile): a plugin never finds no socket from then on. A
// replaced server reads what plugins sent it before, within PluginLogDrainBound.
func (p *pluginLogServers) retake() error {
	var errs []error
	for _, srv := range p.servers {
		if !slices.ContainsFunc(srv.paths, pathGone) {
			continue
		}
		stop, err := srv.start()
		if err != nil {
			errs = append(errs, fmt.Errorf("make %s again: %w", srv.what, err))
			continue
		}
		srv.stop(time.Now().Add(PluginLogDrainBound))
		srv.stop = stop
		p.log.Info("made "+srv.what+" again: another agent on this node had taken them over and removed them when it stopped", "socket", srv.paths[0])
	}
	return errors.Join(errs...)
}

// stop stops every server at once, each reading what plugins sent it before,
// within PluginLogDrainBound for all.
func (p *pluginLogServers) stop() {
	deadline := time.Now().Add(PluginLogDrainBound)
	var wg sync.WaitGroup
	for _, srv := range p.servers {
		wg.Go(func() { srv.stop(deadline) })
	}
	wg.Wait()
}

// pathGone reports whether nothing is at path.
func pathGone(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// waitToRetry logs err and waits before a failed accept or read is tried again:
// *backoff doubles from acceptRetryMin to at most acceptRetryMax (the caller sets it
// back to 0 after a success). It is false when done closes first.
func waitToRetry(backoff *time.Duration, done <-chan struct{}, log *slog.Logger, msg string, err error) bool {
	*backoff = min(max(2**backoff, acceptRetryMin), acceptRetryMax)
	log.Error(msg, "error", err, "retryIn", *backoff)
	select {
	case <-time.After(*backoff):
		return true
	case <-done:
		return false
	}
}

// datagramReader is the part of *net.UnixConn that readDatagrams uses.
type datagramReader interface {
	ReadFromUnix(b []byte) (int, *net.UnixAddr, error)
}

// readDatagrams records each datagram from r until r is closed, or a read fails
// once done is closed (stop wakes the read with a deadline, then reads what is
// queued itself). Any other read error (ENOBUFS, ENOMEM: the kernel short of
// memory for a moment) is logged and the read tried again after a wait, doubling
// from acceptRetryMin to acceptRetryMax as for the accept loop: returning would
// leave every later plugin's datagram records unread while the agent stays ready.
func readDatagrams(r datagramReader, done <-chan struct{}, sink *pluginLogSink, log *slog.Logger) {
	// One byte more than a record may have: a longer datagram arrives cut, and
	// that byte tells.
	buf := make([]byte, maxRecord+1)
	var backoff time.Duration
	for {
		n, _, err := r.ReadFromUnix(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			select {
			case <-done:
				return
			default:
			}
			if !waitToRetry(&backoff, done, log, "read failed", err) {
				return
			}
			continue
		}
		backoff = 0
		sink.record(buf[:min(n, maxRecord)], protocolDatagram, n > maxRecord)
	}
}

// classifyPluginRecord reads the outcome of a DEL from the plugin's final record of
// it. Other records (progress, debug) are no event; ADD outcomes come from the
// plugin's events, which do not depend on its log level. DEL's "nothing to do"
// outcomes are logged at debug and so counted only when the plugin logs at debug.
func classifyPluginRecord(rec []byte) (command, outcome string, ok bool) {
	var r struct {
		Msg     string `json:"msg"`
		Command string `json:"command"`
	}
	if json.Unmarshal(rec, &r) != nil || r.Command != "DEL" {
		return "", "", false
	}
	switch r.Msg {
	case "DEL: done":
		return "DEL", "done", true
	case "DEL: no network namespace, nothing to do", "DEL: network namespace already gone":
		return "DEL", "nothing_to_do", true
	}
	return "", "", false
}

// MaxIstioLogBody bounds one POST from Istio's plugin (all the lines of one
// command, a few KiB); a larger body is refused with 413.
const MaxIstioLogBody = 1 << 20

// istioLogTimeout bounds reading one request from Istio's plugin, whose client
// gives up after 1 s itself.
const istioLogTimeout = 5 * time.Second

// serveIstioPluginLogs serves Istio's plugin log protocol on a unix stream socket
// at path until stop is called. stop removes the socket, answers the posts in its
// queue and those being read, until deadline, then closes every connection.
func serveIstioPluginLogs(path string, sink *pluginLogSink, log *slog.Logger) (stop func(deadline time.Time), err error) {
	const what = "Istio plugin log socket"
	ul, err := unixsock.Listen("unix", path, 0o600) // stop removes it, if still ours (ownfile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	l := unixsock.NewDrainListener(ul)
	own, _ := os.Lstat(path)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+pluginlog.IstioLogPath, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxIstioLogBody))
		if err != nil {
			http.Error(w, fmt.Sprintf("body over %d bytes or unreadable: %v", MaxIstioLogBody, err), http.StatusRequestEntityTooLarge)
			return
		}
		lines, err := istioRecords(body)
		if err != nil {
			log.Warn("Istio plugin log post not understood", "error", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, line := range lines {
			sink.m.pluginRecords.WithLabelValues(protocolHTTP).Inc()
			sink.writeLine(line)
		}
	})
	// The connections that are new or active: a request not read yet, or being
	// answered. http.Server.Shutdown drops a request it reads after it began, so
	// stop waits for these itself.
	var (
		busyMu  sync.Mutex
		busy    = map[net.Conn]bool{}
		changed = make(chan struct{}, 1)
	)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: istioLogTimeout, ReadTimeout: istioLogTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
		ConnState: func(c net.Conn, st http.ConnState) {
			busyMu.Lock()
			if st == http.StateNew || st == http.StateActive {
				busy[c] = true
			} else {
				delete(busy, c)
			}
			busyMu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
		}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// net.ErrClosed: stop drained the queue (DrainListener).
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			log.Error(what, "error", err)
		}
	}()
	return func(deadline time.Time) {
		_ = ownfile.Remove(path, own)
		l.Drain()
		wait := time.NewTimer(time.Until(deadline))
		defer wait.Stop()
		// Serve returns once it has accepted every queued connection (an accept
		// failing for want of descriptors is retried until the deadline), each
		// one counted busy before.
		expired := false
		select {
		case <-done:
		case <-wait.C:
			expired = true
		}
		for {
			busyMu.Lock()
			left := len(busy)
			busyMu.Unlock()
			if left == 0 {
				break
			}
			if !expired {
				select {
				case <-changed:
					continue
				case <-wait.C:
				}
			}
			log.Warn("Istio plugin log connections still open at the end of the stop's bound closed", "socket", what,
				"connections", left, "bound", PluginLogDrainBound)
			break
		}
		// Every post read is answered: what is left is idle (kept alive).
		_ = srv.Close()
		<-done
	}, nil
}

// istioLevels maps the levels of Istio's plugin (zap, lower case) to slog's names.
var istioLevels = map[string]string{"debug": "DEBUG", "info": "INFO", "warn": "WARN", "error": "ERROR"}

// istioRecords turns the body Istio's plugin posts, a JSON array of strings each
// holding one JSON record {"level","time","msg",...fields}, into the agent's lines:
// time, level and msg first under slog's names, the record's other fields after
// them, and "plugin":"istio" to tell them from this plugin's. A string that is not
// such a record is passed on as the msg of a record of its own.
func istioRecords(body []byte) ([][]byte, error) {
	var posted []string
	if err := json.Unmarshal(body, &posted); err != nil {
		return nil, fmt.Errorf("not a JSON array of strings (Istio's plugin log format): %w", err)
	}
	var lines [][]byte
	for _, p := range posted {
		var fields map[string]json.RawMessage
		// "null" unmarshals without an error into no map at all.
		if json.Unmarshal([]byte(p), &fields) != nil || fields == nil {
			fields = map[string]json.RawMessage{"msg": mustJSON(strings.TrimSpace(p))}
		}
		var level string
		_ = json.Unmarshal(fields["level"], &level)
		if l, ok := istioLevels[level]; ok {
			fields["level"] = mustJSON(l)
		}
		if _, ok := fields["time"]; !ok {
			fields["time"] = mustJSON(time.Now().UTC().Format(time.RFC3339Nano))
		}
		fields["plugin"] = mustJSON("istio")
		var b strings.Builder
		b.WriteByte('{')
		first := []string{"time", "level", "msg"}
		rest := slices.Sorted(maps.Keys(fields))
		rest = slices.DeleteFunc(rest, func(k string) bool { return slices.Contains(first, k) })
		n := 0
		for _, k := range append(first, rest...) {
			v, ok := fields[k]
			if !ok {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			n++
			b.Write(mustJSON(k))
			b.WriteByte(':')
			b.Write(v)
		}
		b.WriteByte('}')
		var line bytes.Buffer
		if err := json.Compact(&line, []byte(b.String())); err != nil {
			return nil, fmt.Errorf("record %q: %w", p, err)
		}
		lines = append(lines, line.Bytes())
	}
	return lines, nil
}

func mustJSON(v string) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
