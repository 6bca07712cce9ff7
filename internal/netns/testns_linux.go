package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// New creates a network namespace, bind-mounted at dir/name so it outlives the
// thread that made it, with lo up. Delete removes it. Tests and the demo use it for
// throwaway namespaces; it needs root.
func New(dir, name string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return "", fmt.Errorf("create namespace mount point: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread switches namespaces and must come back before it is unlocked:
		// if it stayed in the new namespace and this goroutine happened to run on the
		// main thread (which the runtime never ends), /proc/self would resolve into
		// the new namespace for the rest of the process.
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		setupErr := func() error {
			if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind-mount namespace: %w", err)
			}
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			if err != nil {
				return fmt.Errorf("bring lo up: %w", err)
			}
			return nil
		}()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the runtime discards this thread when the goroutine ends.
			errc <- fmt.Errorf("return to the original namespace: %w (setup: %v)", err, setupErr)
			return
		}
		runtime.UnlockOSThread()
		errc <- setupErr
	}()
	if err := <-errc; err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return "", err
	}
	return path, nil
}

// Delete unmounts and removes a namespace made by New.
func Delete(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
