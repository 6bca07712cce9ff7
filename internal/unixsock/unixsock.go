// Package unixsock makes the agent's unix sockets: each has its mode from the
// moment it can be reached, whatever the process's umask, and takes the place of a
// previous agent's socket in one step, so that a plugin connecting meanwhile reaches
// the old socket or the new one, never no socket.
package unixsock

import (
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// TempDirPrefix starts the name of the directory a socket is made in before it is
// moved into place; a process killed in between leaves it (IsTemp).
const TempDirPrefix = ".b-"

// IsTemp reports whether name, in a socket's directory, is such a directory.
func IsTemp(name string) bool { return strings.HasPrefix(name, TempDirPrefix) }

// Listen makes a stream ("unix") or seqpacket ("unixpacket") socket at path with
// mode (see place).
func Listen(network, path string, mode os.FileMode) (*net.UnixListener, error) {
	c, err := place(path, mode, func(tmp string) (io.Closer, error) {
		l, err := net.ListenUnix(network, &net.UnixAddr{Name: tmp, Net: network})
		if err == nil {
			// The name it was bound to is gone once the socket is in place; what
			// removes the socket at path is the caller's (ownfile).
			l.SetUnlinkOnClose(false)
		}
		return l, err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixListener), nil
}

// ListenPacket makes a datagram ("unixgram") socket at path with mode (see place).
func ListenPacket(path string, mode os.FileMode) (*net.UnixConn, error) {
	c, err := place(path, mode, func(tmp string) (io.Closer, error) {
		return net.ListenUnixgram("unixgram", &net.UnixAddr{Name: tmp, Net: "unixgram"})
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// place binds a socket in a new directory beside path that only its owner can
// enter (mode 0700), gives it mode there, and renames it to path, replacing the
// socket there (a previous agent's). Anything at path that is not a socket is
// refused, naming it. The temporary directory is removed in every case.
func place(path string, mode os.FileMode, bind func(tmp string) (io.Closer, error)) (io.Closer, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("socket %s: a %s is in the way", path, typeName(fi.Mode()))
	}
	// Locked while it exists: an agent's start removes it only once its maker is
	// dead (livetemp).
	dir, release, err := livetemp.MkdirTemp(filepath.Dir(path), TempDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer release()
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	c, err := bind(tmp)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return c, nil
}

func typeName(m fs.FileMode) string {
	if m.IsRegular() {
		return "regular file"
	}
	return regularfile.TypeName(m)
}
