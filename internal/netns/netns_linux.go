package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn with the calling code's network namespace set to the one at path (for
// example /var/run/netns/NAME or /proc/PID/ns/net). fn runs on a fresh goroutine
// locked to its OS thread; child processes started by fn inherit the namespace.
// The thread is switched back even when fn moved it elsewhere (unshare). If it
// cannot be switched back, it is left locked so the Go runtime discards it when the
// goroutine exits.
//
// The namespace files are opened as plain descriptors: an *os.File would first try
// to register each with the runtime's poller, which nsfs refuses (four more system
// calls per file, on every ADD). The target is opened without blocking: a named
// pipe at path (a wrong path) would otherwise hold the open until a writer came;
// it is refused by checkNetNS instead.
func Do(path string, fn func() error) error {
	return DoWithFD(path, func(int) error { return fn() })
}

// DoWithFD is Do, and gives fn the descriptor of the namespace that Do opened,
// open until fn returns: the namespace's apply lock is an flock of it
// (applylock.InNamespace), where opening /proc/thread-self/ns/net from inside
// fn would cost 5-6 µs of path walk, more than the lock itself.
func DoWithFD(path string, fn func(fd int) error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	defer unix.Close(target)
	if err := checkNetNS(target); err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Thread-local namespace: /proc/thread-self is the locked thread.
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		fnErr := fn(target)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Keep the thread locked: it dies with this goroutine instead of running
			// other goroutines in the wrong namespace.
			errc <- fmt.Errorf("restore network namespace after %s: %w (and %v)", path, err, fnErr)
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// ErrNotNetNS is a path that is not a network namespace: a file of another kind,
// such as the mount point a namespace's bind mount leaves once it is unmounted
// (the namespace is gone; the runtime removes the file after).
var ErrNotNetNS = errors.New("not a network namespace file")

// checkNetNS makes sure fd is a network namespace, so a wrong path cannot make Setns
// switch some other namespace or fail obscurely.
func checkNetNS(fd int) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return err
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w (filesystem type %#x)", ErrNotNetNS, st.Type)
	}
	return nil
}

// ID returns the inode number identifying the namespace at path; two paths with the
// same ID are the same namespace.
func ID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat network namespace %s: %w", path, err)
	}
	return st.Ino, nil
}

// InThrowaway runs fn in a new, empty network namespace of its own, made for
// it and gone when it returns: fn runs on a fresh goroutine locked to an OS
// thread that unshares its network namespace and is never unlocked, so the Go
// runtime ends the thread with the goroutine and the namespace with it. Nothing
// fn does there touches the node's namespace: it is how the agent tries what the
// kernel can do. Making the namespace needs CAP_SYS_ADMIN: without it the error
// wraps EPERM (ErrNoThrowaway).
func InThrowaway(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("%w: unshare a network namespace: %w", ErrNoThrowaway, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// ErrNoThrowaway is InThrowaway's error when no namespace could be made (the
// process lacks CAP_SYS_ADMIN): fn did not run.
var ErrNoThrowaway = errors.New("no throwaway network namespace")
