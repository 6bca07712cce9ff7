package iptables

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// lockFileEnvVersion is the first iptables release whose legacy tools take the
// lock XTABLES_LOCKFILE names; earlier ones always take their build's lock, the
// node's /run/xtables.lock, which kube-proxy and every other iptables user on the
// node hold while they write the node's rules.
var lockFileEnvVersion = [3]int{1, 8, 6}

// legacyVersionFile remembers, in Config.NativeStateDir, the version of the node's
// iptables-legacy-restore, as nativeVersionFile does iptables-nft's.
const legacyVersionFile = "iptables-legacy-version"

// masksNodeLock says whether this legacy backend's restores run with the
// namespace's lock mounted over the node's (runWithMasks): for an
// iptables-legacy-restore before 1.8.6, or one whose version cannot be read
// (iptables before 1.8 has no (legacy) in it). Asked once per node and binary,
// then read from the state dir, as nativeAllowed asks iptables-nft.
func (b *Backend) masksNodeLock() bool {
	b.nodeLockOnce.Do(func() {
		v, err := b.restoreVersion()
		b.nodeLockMasked = err != nil || compareVersion(v, lockFileEnvVersion) < 0
	})
	return b.nodeLockMasked
}

// fileMask is a file a tool sees in place of one of the node's, in a mount
// namespace of its own (runWithMasks).
type fileMask struct {
	src, dst string
	// create makes both files first: a bind mount needs them, and the tool
	// would create its lock itself.
	create   bool
	readOnly bool
}

// runWithMasks runs run (a tool's start and wait: cmd.Run, or its run in a pod's
// user namespace) in the calling thread's network namespace with each mask's src
// bind-mounted over its dst, in a mount namespace of its own: for legacy iptables
// before 1.8.6 the namespace's lock over the node's (as Istio's plugin runs
// them), so the tool takes the namespace's lock, as later releases do by
// XTABLES_LOCKFILE, and does not wait for the node's writers; and /dev/null over
// nsswitch.conf where the node's user and group lookups may leave the machine
// (nssIsLocal), as Istio's plugin runs every iptables. The mounts are never seen
// outside that namespace, which lives on one thread that the runtime ends after
// the tool. If the mount namespace cannot be set up, the tool runs as before; a
// mask that cannot be mounted leaves the tool the node's file.
func runWithMasks(run func() error, masks []fileMask) error {
	net, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return run()
	}
	defer unix.Close(net)
	masked := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		// Never unlocked: from the unshare on, the thread's mount namespace is
		// its own, so the runtime ends the thread with this goroutine.
		runtime.LockOSThread()
		if err := enterPrivateMounts(net); err != nil {
			masked <- err
			return
		}
		for _, m := range masks {
			_ = m.mount()
		}
		masked <- nil
		done <- run()
	}()
	if err := <-masked; err != nil {
		return run() // on the calling thread, in its namespaces
	}
	return <-done
}

// enterPrivateMounts moves the calling thread into a private copy of its mount
// namespace and into the network namespace net.
func enterPrivateMounts(net int) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Setns(net, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the network namespace: %w", err)
	}
	// Private, so that the mounts never propagate to the node.
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	return nil
}

// mount mounts m.src over m.dst in the calling thread's mount namespace.
func (m fileMask) mount() error {
	if m.create {
		for _, p := range []string{m.src, m.dst} {
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return fmt.Errorf("create %s: %w", p, err)
			}
			unix.Close(fd)
		}
	}
	if err := unix.Mount(m.src, m.dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount %s over %s: %w", m.src, m.dst, err)
	}
	if m.readOnly {
		if err := unix.Mount("", m.dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", m.dst, err)
		}
	}
	return nil
}
