package testns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// UserNamespaceBase is where the uids and gids of a namespace made by
// NewInUserNamespace start on the node: its uid 0 is the node's 100000, so a
// proxy's 1337 there is the node's 101337.
const UserNamespaceBase = 100000

// NewInUserNamespace makes the network namespace of a pod with hostUsers: false
// as containerd 2 and CRI-O make it: created inside a user namespace of its own,
// which maps its uids and gids 0-65535 to the node's from UserNamespaceBase on.
// lo is up. A sleeping process of that namespace holds it until the test ends;
// the namespace is named as cri-dockerd names a pod's, /proc/PID/ns/net. It
// needs root.
func NewInUserNamespace(t testing.TB) string {
	t.Helper()
	holder := exec.Command("sleep", "3600")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: UserNamespaceBase, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: UserNamespaceBase, Size: 65536}},
	}
	if err := holder.Start(); err != nil {
		t.Fatalf("start a process in a user and network namespace of its own: %v", err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	ns := fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)
	if err := netns.Do(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		return err
	}); err != nil {
		t.Fatalf("bring lo up in %s: %v", ns, err)
	}
	return ns
}
