package iptables

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/test/harness/poll"
)

// TestApplyLockRemovedByGCWhileWaitedForIsNotHeldTwice: the plugin's GC removes
// an hour-old apply lock file while holding its lock (removeUnheldLock), and an
// apply that had opened the file and waited for that lock then gets it, on a file
// no longer at the path. The next apply of the namespace (the repair controller
// beside a retried ADD) opens a new file there and must still wait for the first:
// two read-then-restore applies at once duplicate hook rules or roll back each
// other's (ApplyWithRollback).
func TestApplyLockRemovedByGCWhileWaitedForIsNotHeldTwice(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{lockDir: dir}
	release, err := b.lockApply(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release()
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the lock directory holds %v (%v), want the one apply lock file", entries, err)
	}
	path := filepath.Join(dir, entries[0].Name())

	// GC, as removeUnheldLock does: open, lock, ...
	gc, err := os.OpenFile(path, os.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(gc.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	type result struct {
		release func()
		err     error
	}
	first := make(chan result, 1)
	go func() {
		r, err := b.lockApply(context.Background())
		first <- result{r, err}
	}()
	poll.Until(t, 10*time.Second, time.Millisecond, "the first apply has opened the lock file", func() bool {
		return openCount(t, path) == 2 // GC's and the apply's
	})
	// ... remove, and unlock by closing.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	gc.Close()
	var one result
	select {
	case one = <-first:
		if one.err != nil {
			t.Fatal(one.err)
		}
		defer one.release()
	case <-time.After(10 * time.Second):
		t.Fatal("the first apply still waits after GC released the lock")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	two, err := b.lockApply(ctx)
	if err == nil {
		two()
		t.Fatal("a second apply took the namespace's apply lock while the first held it (on the file GC removed)")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the second apply: %v, want it to wait for the first until its context ends", err)
	}
}

// openCount is how many of this process's descriptors are open on path.
func openCount(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}
