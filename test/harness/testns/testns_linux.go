package testns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
)

// New creates a network namespace, bind-mounted at dir/name so it outlives the
// thread that made it, with lo up. Delete removes it. It needs root.
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
	// netns.Do runs fn on a locked thread and puts that thread back in this
	// namespace afterwards, although fn moved it to a new one: no thread of the
	// process (the main one in particular, which /proc/self follows) stays behind.
	err = netns.Do("/proc/self/ns/net", func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
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
	})
	if err != nil {
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

// Run runs cmd in the namespace at ns and returns what it printed (stdout and stderr
// together); a failure ends the test.
func Run(t testing.TB, ns string, cmd *exec.Cmd) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, func() error {
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(cmd.Args, " "), ns, err, out)
	}
	return string(out)
}
