package applylock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// WaitBound bounds the wait for another apply's hold of the namespace's lock,
// within the caller's own bound (the ADD's 2 min, the repair's 30 s). An apply
// holds it for milliseconds, and at most for its own bound and its rollback's
// (capture.RollbackBound): a holder past this one is stuck, and the waiter fails
// naming it rather than wait for it.
const WaitBound = 30 * time.Second

type namespaceKey struct{}

// InNamespace returns ctx under which Take locks the network namespace through
// fd, a descriptor of it that the caller keeps open until Take's release
// (capture.Apply's, from netns.DoWithFD), instead of opening
// /proc/thread-self/ns/net (5-6 µs of path walk). Take under it must not be
// called again before the release: a second flock of the same open file is
// not a second lock.
func InNamespace(ctx context.Context, fd int) context.Context {
	return context.WithValue(ctx, namespaceKey{}, fd)
}

// Take takes the apply lock of the calling thread's network namespace (see the
// package doc) and returns its release. It waits while another apply, a
// removal or a read holds it, at most WaitBound and until ctx ends; then the
// error is a *HeldError naming
// the namespace and the holder, which wraps context.DeadlineExceeded (or ctx's
// error). Uncontended it is two flock calls, the lock and its release (and the
// open and close of the namespace's file unless ctx gives a descriptor of it,
// InNamespace): no file is made or written, on any file system.
func Take(ctx context.Context) (release func(), err error) {
	return take(ctx, WaitBound, unix.LOCK_EX)
}

// TakeShared is Take for a reader of the namespace's capture (capture.Verify,
// capture.Check: the plugin's CHECK, the agent's verify, the doctor): it waits,
// within the same bounds and failing with the same HeldError, while an apply or
// a removal holds the lock, and holds it shared, so that readers do not wait
// for one another and an apply or a removal waits for them (see the package
// doc).
func TakeShared(ctx context.Context) (release func(), err error) {
	return take(ctx, WaitBound, unix.LOCK_SH)
}

// take takes the lock, exclusive or shared (how: unix.LOCK_EX or
// unix.LOCK_SH), waiting at most bound.
func take(ctx context.Context, bound time.Duration, how int) (release func(), err error) {
	fd, given := ctx.Value(namespaceKey{}).(int)
	if !given {
		if fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil, fmt.Errorf("the apply lock: open the network namespace: %w", err)
		}
	}
	done := func() {
		if !given {
			unix.Close(fd)
		}
	}
	var start time.Time
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := unix.Flock(fd, how|unix.LOCK_NB)
		if err == nil {
			return func() {
				_ = unix.Flock(fd, unix.LOCK_UN)
				done()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			done()
			return nil, fmt.Errorf("the apply lock: lock the network namespace: %w", err)
		}
		if start.IsZero() {
			start = time.Now()
		}
		left := bound - time.Since(start)
		if left <= 0 {
			defer done()
			return nil, held(fd, time.Since(start), fmt.Sprintf("the apply lock's bound, %v", bound), context.DeadlineExceeded)
		}
		timer := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			defer done()
			return nil, held(fd, time.Since(start), "the caller's bound", ctx.Err())
		case <-timer.C:
		}
	}
}

// HeldError is Take's error when it gave up waiting.
type HeldError struct {
	// Namespace is the network namespace, as the kernel names it: net:[INODE].
	Namespace string
	// Holder is the process that holds the lock, as /proc/locks shows it:
	// "pid 1234 (istio-cni)", the plugin's ADD, DEL or CHECK; "(install-cni)",
	// the agent's repair in place; or why it cannot be named. Of readers that
	// hold it shared, it names the first /proc/locks lists.
	Holder string
	Waited time.Duration
	// Bound says which bound ran out: WaitBound, or the caller's.
	Bound string
	Err   error
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("network namespace %s: gave up after %v (%s) waiting for its apply lock, held by %s: %v",
		e.Namespace, e.Waited.Round(time.Millisecond), e.Bound, e.Holder, e.Err)
}

func (e *HeldError) Unwrap() error { return e.Err }

// held is the HeldError of a wait for the lock of the namespace of fd.
func held(fd int, waited time.Duration, bound string, err error) error {
	e := &HeldError{Namespace: "net:[?]", Waited: waited, Bound: bound, Err: err}
	var st unix.Stat_t
	if serr := unix.Fstat(fd, &st); serr != nil {
		e.Holder = fmt.Sprintf("a process not named (%v)", serr)
		return e
	}
	e.Namespace = fmt.Sprintf("net:[%d]", st.Ino)
	e.Holder = holderOf(st)
	return e
}

// maxLocksLines bounds the lines of /proc/locks holderOf reads: every lock of
// the node is listed there.
const maxLocksLines = 1 << 20

// holderOf names the process that holds the flock of the file st describes,
// as /proc/locks lists it: its pid in this process's PID namespace and its
// name. A holder outside that namespace (the plugin on the node, seen from the
// agent's container) is listed with pid 0.
func holderOf(st unix.Stat_t) string {
	// As the kernel prints it: "1: FLOCK  ADVISORY  WRITE 4242 00:04:4026532301 0 EOF".
	file := fmt.Sprintf("%02x:%02x:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return fmt.Sprintf("a process not named (%v)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 0; sc.Scan() && n < maxLocksLines; n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != file {
			continue // a waiter ("->"), another kind of lock, another file
		}
		if pid := fields[4]; pid != "0" {
			comm, err := os.ReadFile("/proc/" + pid + "/comm")
			if err != nil {
				return "pid " + pid
			}
			return "pid " + pid + " (" + strings.TrimSpace(string(comm)) + ")"
		}
		return "a process outside this one's PID namespace (from the agent's container: the plugin)"
	}
	return "a process /proc/locks does not list (it may have let go since)"
}
