package iptables

import (
	"fmt"
	"os/exec"
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
// namespace's lock mounted over the node's (runWithLockMasked): for an
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

// runWithLockMasked runs cmd in the calling thread's network namespace with lock
// bind-mounted over nodeLock, in a mount namespace of its own (as Istio's plugin
// runs iptables before 1.8.6): the tool then takes the namespace's lock, as later
// releases do by XTABLES_LOCKFILE, and does not wait for the node's writers. The
// mount is never seen outside that namespace, which lives on one thread that the
// runtime ends after the tool. If the mount namespace cannot be set up, cmd runs
// as before, on the node's lock.
func runWithLockMasked(cmd *exec.Cmd, lock, nodeLock string) error {
	net, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return cmd.Run()
	}
	defer unix.Close(net)
	masked := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		// Never unlocked: from the unshare on, the thread's mount namespace is
		// its own, so the runtime ends the thread with this goroutine.
		runtime.LockOSThread()
		if err := maskLock(net, lock, nodeLock); err != nil {
			masked <- err
			return
		}
		masked <- nil
		done <- cmd.Run()
	}()
	if err := <-masked; err != nil {
		return cmd.Run() // on the calling thread, in its namespaces
	}
	return <-done
}

// maskLock moves the calling thread into a private copy of its mount namespace
// and into the network namespace net, and mounts lock over nodeLock there.
func maskLock(net int, lock, nodeLock string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Setns(net, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the network namespace: %w", err)
	}
	// Private, so that the mount below never propagates to the node.
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	// A bind mount needs both files; the tool would create the node's itself.
	for _, p := range []string{lock, nodeLock} {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		unix.Close(fd)
	}
	if err := unix.Mount(lock, nodeLock, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount %s over %s: %w", lock, nodeLock, err)
	}
	return nil
}
