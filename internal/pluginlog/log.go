// Package pluginlog sets up the plugin's logging. The plugin's stdout carries only its
// CNI result, so logs go to stderr (the runtime's journal), optionally to a file, and
// to the node agent's log socket when it exists, so that `kubectl logs` of the agent
// shows every ADD/DEL decision.
package pluginlog

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"time"
)

// Options say where logs go besides stderr.
type Options struct {
	Level slog.Level
	// File, when set, receives the same records (appended).
	File string
	// Socket, when set and present, is the agent's unix datagram socket; each record
	// is sent as one JSON datagram. A missing or dead agent never slows the plugin.
	Socket string
}

// New returns the logger and a function that closes its outputs.
func New(stderr io.Writer, o Options) *Logger {
	hopts := &slog.HandlerOptions{Level: o.Level}
	handlers := []slog.Handler{slog.NewTextHandler(stderr, hopts)}
	var closers []io.Closer
	if o.File != "" {
		if f, err := openBounded(o.File); err == nil {
			handlers = append(handlers, slog.NewJSONHandler(f, hopts))
			closers = append(closers, f)
		}
	}
	if o.Socket != "" {
		if c, err := net.DialTimeout("unixgram", o.Socket, 50*time.Millisecond); err == nil {
			handlers = append(handlers, slog.NewJSONHandler(&datagramWriter{c}, hopts))
			closers = append(closers, c)
		}
	}
	return &Logger{Logger: slog.New(fanout(handlers)), closers: closers}
}

// MaxFileBytes bounds the log file (it lives in the agent's run dir, a tmpfs, so in
// node memory): a file that reached it is moved to <file>.1, replacing the previous
// one, and a new file is started. The two hold at most 2 x MaxFileBytes. One ADD
// writes a few hundred bytes, so 5 MiB is the last ten thousand or so.
const MaxFileBytes = 5 << 20

// openBounded opens path for appending, first rotating it when it is full. Plugins
// run concurrently: two may rotate at once, which loses at most one rotated file's
// older lines, never the bound.
func openBounded(path string) (*os.File, error) {
	if st, err := os.Stat(path); err == nil && st.Size() >= MaxFileBytes {
		_ = os.Rename(path, path+".1")
	}
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// Logger is a slog.Logger that owns its outputs.
type Logger struct {
	*slog.Logger
	closers []io.Closer
}

// Close closes the file and socket outputs.
func (l *Logger) Close() error {
	var errs []error
	for _, c := range l.closers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// datagramWriter sends each Write (one JSON record) as one datagram, never blocking.
type datagramWriter struct{ c net.Conn }

func (w *datagramWriter) Write(p []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := w.c.Write(p); err != nil {
		return len(p), nil // the agent may be gone; logging must not fail the plugin
	}
	return len(p), nil
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
