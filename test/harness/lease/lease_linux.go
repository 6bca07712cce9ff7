// Package lease makes a file that exists and is whole impossible to open for a
// while, as a read that fails for a reason other than the file's content does (a
// process out of descriptors, a file system that errs): a write lease held on it
// makes every non-blocking open fail with EWOULDBLOCK (EAGAIN) until it is let go.
package lease

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Hold takes a write lease on path (the test must be root or own the file, and no
// other descriptor of the file may be open) and returns its release, also run when
// tb's test ends. Meanwhile an open of path with O_NONBLOCK fails with EWOULDBLOCK;
// a blocking open would wait for the lease's break (lease-break-time, 45 s).
func Hold(tb testing.TB, path string) (release func()) {
	tb.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		unix.Close(fd)
		tb.Fatalf("write lease on %s: %v", path, err)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
		unix.Close(fd)
	}
	tb.Cleanup(release)
	return release
}
