// Package livetemp makes the temporary files and directories that the agent and
// the plugin rename into place, in a way that says whether their writer still
// lives: the writer holds an exclusive flock on each for as long as it may rename
// it, and the kernel drops the lock when the writer dies. RemoveAbandoned, run by
// an agent's start, then removes what a killed writer left and never what a live
// one is about to rename: the agent's own features starting beside it, an earlier
// agent still running during a rolling update (both mount the node's directories),
// or a plugin saving its TLS session. (CI once saw the start remove the pod
// cache's socket directory under it: the cache was down until its restart.)
//
// A writer between its create and its lock (a few system calls) is not yet
// protected; the cleanup may then remove its file, and its rename fails and is
// retried as any failed write is. Nothing is ever half-written in place.
package livetemp

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// CreateTemp is os.CreateTemp, locked until release is called, which a writer does
// after its rename. The lock is held on a read-only descriptor of its own, so that
// f can be closed before the rename: a binary still open for writing when a
// runtime execs it fails with ETXTBSY.
func CreateTemp(dir, pattern string) (f *os.File, release func(), err error) {
	f, err = os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, nil, err
	}
	fd, err := unix.Open(f.Name(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		if err = lock(fd); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return f, func() { unix.Close(fd) }, nil
}

// MkdirTemp is os.MkdirTemp, locked until release is called; release does not
// remove the directory.
func MkdirTemp(dir, pattern string) (path string, release func(), err error) {
	path, err = os.MkdirTemp(dir, pattern)
	if err != nil {
		return "", nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		if err = lock(fd); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		os.RemoveAll(path)
		return "", nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return path, func() { unix.Close(fd) }, nil
}

// lock waits for the exclusive lock: only a cleanup holds it a moment, to remove
// the file (the writer's rename then fails and is retried).
func lock(fd int) error {
	for {
		err := unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// RemoveAbandoned removes path (a file or a whole directory) unless a live writer
// holds its lock, and reports whether it did. Something at path that cannot be
// locked (a symbolic link, a file it may not read) is no writer's temporary in
// progress, and is removed too. A path already gone is not an error.
func RemoveAbandoned(path string) (removed bool, err error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return remove(path)
	}
	defer unix.Close(fd)
	switch err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil // its writer lives
	case err != nil:
		return false, fmt.Errorf("lock %s: %w", path, err)
	}
	return remove(path)
}

func remove(path string) (bool, error) {
	if err := os.RemoveAll(path); err != nil {
		return false, err
	}
	return true, nil
}
