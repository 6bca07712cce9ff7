// Package nofile runs a test's process out of file descriptors (EMFILE), as a
// process at its RLIMIT_NOFILE is: no mount, no root, nothing outside the process.
package nofile

import (
	"os"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Exhaust lowers the process's soft RLIMIT_NOFILE just above the descriptors it
// holds and fills the rest with copies of /dev/null, leaving spare free: past them
// every open, socket or accept of the process fails with EMFILE. release (also run
// when tb's test ends) closes the copies and puts the limit back. The test must not
// run in parallel with others: the limit is the whole process's.
func Exhaust(tb testing.TB, spare int) (release func()) {
	tb.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		tb.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	highest := 0
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			highest = max(highest, fd)
		}
	}
	// A raw descriptor, not an *os.File, whose finalizer could close a
	// descriptor number reused since.
	null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	low := orig
	low.Cur = uint64(highest + 1 + spare + 32)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		syscall.Close(null)
		tb.Fatal(err)
	}
	var held []int
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		for _, fd := range held {
			syscall.Close(fd)
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			tb.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
	}
	tb.Cleanup(release)
	held = append(held, null)
	for {
		fd, err := unix.FcntlInt(uintptr(null), unix.F_DUPFD_CLOEXEC, 0)
		if err == unix.EMFILE {
			break
		}
		if err != nil {
			release()
			tb.Fatalf("fill the descriptor table: %v", err)
		}
		held = append(held, fd)
	}
	for range spare {
		syscall.Close(held[len(held)-1])
		held = held[:len(held)-1]
	}
	return release
}

// Socket is a client socket made before Exhaust: connecting, writing and closing
// it take no new descriptor, so a test can connect to its server while the
// process has none free, and the server's accept is the only call that needs
// one. A dial after Exhaust needs a spare descriptor, which anything else the
// test process does meanwhile (a goroutine an earlier test left) may take first.
type Socket struct {
	fd int
}

// NewSocket makes a socket of the given domain and type (syscall.AF_UNIX,
// syscall.SOCK_SEQPACKET); it is closed when tb's test ends.
func NewSocket(tb testing.TB, domain, typ int) *Socket {
	tb.Helper()
	fd, err := syscall.Socket(domain, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("socket: %v", err)
	}
	s := &Socket{fd: fd}
	tb.Cleanup(s.Close)
	return s
}

// Connect connects the socket to sa; on a loopback or unix socket it returns once
// the connection waits in the server's queue, before any accept.
func (s *Socket) Connect(sa syscall.Sockaddr) error {
	return syscall.Connect(s.fd, sa)
}

// Write writes b whole in one call (one record on a SOCK_SEQPACKET socket).
func (s *Socket) Write(b []byte) error {
	n, err := syscall.Write(s.fd, b)
	if err == nil && n != len(b) {
		err = syscall.EIO
	}
	return err
}

// Close closes the socket; later calls do nothing.
func (s *Socket) Close() {
	if s.fd >= 0 {
		syscall.Close(s.fd)
		s.fd = -1
	}
}
