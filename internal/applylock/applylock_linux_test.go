package applylock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// newNS is a new network namespace, removed with the test.
func newNS(t *testing.T) string {
	t.Helper()
	ns, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	return ns
}

// takeIn takes the apply lock of the namespace at ns, with bound: through
// /proc/thread-self/ns/net, or with viaPath through the descriptor of ns that
// netns.DoWithFD opened (InNamespace), as capture.Apply takes it. The
// descriptor stays open until the release, as capture.Apply's does.
func takeIn(ctx context.Context, t *testing.T, ns string, viaPath bool, bound time.Duration) (release func(), err error) {
	t.Helper()
	return takeHow(ctx, t, ns, viaPath, bound, unix.LOCK_EX)
}

// takeHow is takeIn, the lock taken exclusive or shared (how: unix.LOCK_EX,
// unix.LOCK_SH).
func takeHow(ctx context.Context, t *testing.T, ns string, viaPath bool, bound time.Duration, how int) (release func(), err error) {
	t.Helper()
	taken := make(chan error, 1)
	let := make(chan struct{})
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		ran := false
		derr := netns.DoWithFD(ns, func(fd int) error {
			ctx := ctx
			if viaPath {
				ctx = InNamespace(ctx, fd)
			}
			ran = true
			held, err := take(ctx, bound, how)
			taken <- err
			if err == nil {
				<-let
				held()
			}
			return nil
		})
		if !ran {
			taken <- derr
		}
	}()
	if err := <-taken; err != nil {
		return nil, err
	}
	return func() {
		close(let)
		<-gone
	}, nil
}

// TestTheApplyLockIsPerNamespace: while an apply holds one namespace's lock,
// another namespace's is taken at once (a pod's ADD never waits for another
// pod's: issue 17), and a second apply into the held namespace waits, whether
// it reaches the namespace through the same path or another (the runtime's
// bind mount, /proc): when its bound runs out it fails, naming the namespace
// (as the kernel does, net:[INODE]), the holder (its pid and name, as
// /proc/locks and /proc/PID/comm show them), how long it waited and which
// bound ran out, and it wraps context.DeadlineExceeded. Once the holder lets
// go, the lock is taken at once.
func TestTheApplyLockIsPerNamespace(t *testing.T) {
	root.Require(t)
	one, two := newNS(t), newNS(t)
	release, err := takeIn(context.Background(), t, one, false, WaitBound)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	other, err := takeIn(context.Background(), t, two, true, time.Nanosecond)
	if err != nil {
		t.Fatalf("another namespace's lock, while one is held: %v", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("another namespace's lock took %v", took)
	}
	other()

	id, err := netns.ID(one)
	if err != nil {
		t.Fatal(err)
	}
	for _, viaPath := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the caller's, longer
		start = time.Now()
		_, err = takeIn(ctx, t, one, viaPath, 200*time.Millisecond)
		waited := time.Since(start)
		cancel()
		var he *HeldError
		if !errors.As(err, &he) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a second apply into the held namespace (through its path: %v): %v; want a HeldError wrapping the deadline", viaPath, err)
		}
		if waited < 200*time.Millisecond || waited > 2*time.Second {
			t.Errorf("the second apply gave up after %v; want its bound, 200ms", waited)
		}
		for _, want := range []string{
			fmt.Sprintf("network namespace net:[%d]: gave up after ", id),
			"(the apply lock's bound, 200ms) waiting for its apply lock, ",
			fmt.Sprintf("held by pid %d (%s): ", os.Getpid(), comm(t)),
			": context deadline exceeded",
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the second apply's error:\n%v\nwant it to say %q", err, want)
			}
		}
	}

	release()
	again, err := takeIn(context.Background(), t, one, true, time.Nanosecond)
	if err != nil {
		t.Fatalf("the lock, once let go: %v", err)
	}
	again()
}

// TestReadersShareTheLockAndExcludeAnApply: the lock taken shared (TakeShared:
// capture.Verify and capture.Check, the plugin's CHECK, the doctor) is taken
// at once by a second reader, through another descriptor of the namespace,
// while an apply (Take) waits for both and gives up naming a holder; while an
// apply holds it, a reader waits and gives up naming the apply. Once let go,
// each is taken at once.
func TestReadersShareTheLockAndExcludeAnApply(t *testing.T) {
	root.Require(t)
	ns := newNS(t)
	bg := context.Background()
	wantHeldBy := fmt.Sprintf("held by pid %d (%s): ", os.Getpid(), comm(t))

	one, err := takeHow(bg, t, ns, true, WaitBound, unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	two, err := takeHow(bg, t, ns, false, time.Nanosecond, unix.LOCK_SH)
	if err != nil {
		t.Fatalf("a second reader, while one holds the lock: %v", err)
	}
	_, err = takeHow(bg, t, ns, true, 100*time.Millisecond, unix.LOCK_EX)
	var he *HeldError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), wantHeldBy) {
		t.Errorf("an apply while two readers hold the lock: %v; want a HeldError saying %q", err, wantHeldBy)
	}
	one()
	_, err = takeHow(bg, t, ns, true, 100*time.Millisecond, unix.LOCK_EX)
	if !errors.As(err, &he) {
		t.Errorf("an apply while one reader still holds the lock: %v; want a HeldError", err)
	}
	two()

	apply, err := takeHow(bg, t, ns, true, time.Nanosecond, unix.LOCK_EX)
	if err != nil {
		t.Fatalf("an apply once the readers let go: %v", err)
	}
	_, err = takeHow(bg, t, ns, true, 100*time.Millisecond, unix.LOCK_SH)
	if !errors.As(err, &he) || !strings.Contains(err.Error(), wantHeldBy) || !strings.Contains(err.Error(), "(the apply lock's bound, 100ms)") {
		t.Errorf("a reader while an apply holds the lock: %v; want a HeldError saying %q and the bound", err, wantHeldBy)
	}
	apply()
	again, err := takeHow(bg, t, ns, false, time.Nanosecond, unix.LOCK_SH)
	if err != nil {
		t.Fatalf("a reader once the apply let go: %v", err)
	}
	again()
}

// comm is this process's name, as /proc/PID/comm shows it.
func comm(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestAWaitEndsWithTheCallersBound: a wait for a held lock ends when the
// caller's context does, before the lock's own bound, saying so.
func TestAWaitEndsWithTheCallersBound(t *testing.T) {
	root.Require(t)
	ns := newNS(t)
	release, err := takeIn(context.Background(), t, ns, true, WaitBound)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = takeIn(ctx, t, ns, true, WaitBound)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the wait took %v; want the caller's 100ms", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait under an expiring context: %v; want the deadline", err)
	}
	if !strings.Contains(err.Error(), "(the caller's bound)") {
		t.Errorf("the error:\n%v\nwant it to say the caller's bound ran out", err)
	}
}

// BenchmarkTakeUncontended is what an apply pays for the lock when no other
// apply holds it (every ADD's case): Take and its release, through the
// namespace's descriptor that the caller holds (capture.Apply's, InNamespace)
// or through /proc/thread-self/ns/net; and what a read pays (TakeShared,
// through the descriptor capture.Verify and capture.Check hold: CHECK's path).
func BenchmarkTakeUncontended(b *testing.B) {
	for _, c := range []struct {
		name  string
		given bool
		take  func(context.Context) (func(), error)
	}{{"descriptor", true, Take}, {"proc", false, Take}, {"descriptor-shared", true, TakeShared}} {
		b.Run(c.name, func(b *testing.B) {
			if err := netns.DoWithFD("/proc/self/ns/net", func(fd int) error {
				ctx := context.Background()
				if c.given {
					ctx = InNamespace(ctx, fd)
				}
				for b.Loop() {
					release, err := c.take(ctx)
					if err != nil {
						return err
					}
					release()
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		})
	}
}
