package node

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// MachineLockName serializes whole nodes on one machine. Nodes have separate state
// dirs, but kubelet and containerd share host-wide places (libcni's result cache in
// /var/lib/cni, the k8s.io cgroups, host sysctls) whose clean-up and leftover checks
// would see another node's files. The lock is a unix socket in the abstract
// namespace (no file: nothing is left on the host, and it is released when its
// holder exits, however it exits).
const MachineLockName = "@istio-cni-node.lock"

// MachineLockWait bounds how long LockMachine waits for another node to go down.
const MachineLockWait = 45 * time.Minute

// LockMachine blocks until no other node (test, demo) runs on this machine, and
// returns the function that releases the lock. It says once on stderr that it is
// waiting, and gives up after MachineLockWait.
func LockMachine() (unlock func(), err error) {
	deadline := time.Now().Add(MachineLockWait)
	said := false
	for {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: MachineLockName, Net: "unix"})
		if err == nil {
			return func() { l.Close() }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("node machine lock %s: %w", MachineLockName, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("node machine lock %s: another node has held it for %s", MachineLockName, MachineLockWait)
		}
		if !said {
			fmt.Fprintf(os.Stderr, "node: waiting for another node on this machine to go down (lock %s)\n", MachineLockName)
			said = true
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ForwardingSysctls are the host settings ptp turns on when it runs in the host's
// network namespace (IPv4 and IPv6 forwarding).
var ForwardingSysctls = []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"}

// SaveSysctls reads the named settings (paths under /proc/sys) and returns the
// function that writes back each one that changed since. Tests that run CNI
// plugins in the host's network namespace use it with LockMachine, so that
// neither the host nor a node test running beside them sees their changes.
func SaveSysctls(names ...string) (restore func() error, err error) {
	saved := map[string]string{}
	for _, n := range names {
		v, err := os.ReadFile("/proc/sys/" + n)
		if err != nil {
			return nil, fmt.Errorf("node: read sysctl %s: %w", n, err)
		}
		saved[n] = string(v)
	}
	return func() error {
		var errs []error
		for n, v := range saved {
			if now, err := os.ReadFile("/proc/sys/" + n); err == nil && string(now) == v {
				continue
			}
			if err := os.WriteFile("/proc/sys/"+n, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("node: restore sysctl %s: %w", n, err))
			}
		}
		return errors.Join(errs...)
	}, nil
}
