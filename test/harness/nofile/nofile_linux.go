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
