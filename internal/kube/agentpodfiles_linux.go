package kube

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// agentPodFilesKept reports whether a process holds the write lock on the pod
// files' AgentPodFilesLock in dir: an agent that keeps them current. It only asks
// (F_OFD_GETLK) and takes no lock, so it never delays the agent or another
// plugin: an open, one fcntl and a close. No lock file (no agent, an earlier
// agent's directory, or no directory) is not kept.
func agentPodFilesKept(dir string) (bool, error) {
	fd, err := unix.Open(filepath.Join(dir, AgentPodFilesLock), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	// Would a read lock of the whole file be refused? Only by a write lock.
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type == unix.F_WRLCK, nil
}

// KeepAgentPodFiles takes the lock that tells plugins that this process keeps the
// pod files of dir current (AgentPodFilesLock), until release is called or the
// process dies. dir is the directory the caller made, open: the lock file is
// made in it even when another agent has put a directory of its own at its path
// since. The lock is held on a descriptor of its own, closed by release (the
// kernel drops an open file description's lock with its last descriptor: no child
// process inherits it, O_CLOEXEC). A lock another process holds is an error.
func KeepAgentPodFiles(dir *os.File) (release func(), err error) {
	conn, err := dir.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("lock the pod files: %w", err)
	}
	fd := -1
	if cerr := conn.Control(func(dirfd uintptr) {
		fd, err = unix.Openat(int(dirfd), AgentPodFilesLock, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	}); cerr != nil {
		err = cerr
	}
	path := filepath.Join(dir.Name(), AgentPodFilesLock)
	if err != nil {
		return nil, fmt.Errorf("lock the pod files: %s: %w", path, err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock the pod files: %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}
