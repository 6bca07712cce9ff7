// Package regularfile opens and reads files that must be regular files, without
// waiting: a FIFO (or a unix socket, a device) put where a config, a credential, a
// pod file or a log file is expected would otherwise block the open until a peer
// came, past every bound of the caller. Every such open in this project goes
// through Open, so the rule and its error are the same everywhere.
package regularfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrNotRegular is the error (errors.Is) for a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// NotRegularError names the path and what it is instead.
type NotRegularError struct {
	Path string
	Type string // "named pipe", "socket", "directory", ...
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s: not a regular file (%s)", e.Path, e.Type)
}

// Is makes errors.Is(err, ErrNotRegular) hold.
func (e *NotRegularError) Is(target error) bool { return target == ErrNotRegular }

// Open opens path with flag (and perm, for O_CREATE) without blocking and returns
// it only when it is a regular file; a symbolic link to one is followed. Anything
// else is a *NotRegularError. An error of the open itself is returned as is
// (errors.Is(err, fs.ErrNotExist) stays testable).
func Open(path string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NONBLOCK, perm)
	if errors.Is(err, syscall.ENXIO) { // opened for writing: a FIFO no one reads, a unix socket
		typ := "no reader"
		if st, serr := os.Stat(path); serr == nil {
			typ = TypeName(st.Mode())
		}
		return nil, &NotRegularError{Path: path, Type: typ}
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, &NotRegularError{Path: path, Type: TypeName(st.Mode())}
	}
	return f, nil
}

// ReadBounded reads the regular file at path whole, refusing one over max bytes
// (read at most max+1 bytes, so a file that grows is not read without end).
func ReadBounded(path string, max int) ([]byte, error) {
	f, err := Open(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// TypeName names the type of a file that is not a regular one.
func TypeName(m fs.FileMode) string {
	switch m.Type() {
	case fs.ModeNamedPipe:
		return "named pipe"
	case fs.ModeSocket:
		return "socket"
	case fs.ModeDevice:
		return "block device"
	case fs.ModeDevice | fs.ModeCharDevice:
		return "character device"
	case fs.ModeDir:
		return "directory"
	}
	return m.Type().String()
}
