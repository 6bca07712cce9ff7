package node

import (
	"fmt"
	"os"
	"syscall"
)

// MachineLockPath serializes whole nodes on one machine. Nodes have separate state
// dirs, but kubelet and containerd share host-wide places (libcni's result cache in
// /var/lib/cni, the k8s.io cgroups, host sysctls) whose clean-up and leftover checks
// would see another node's files.
const MachineLockPath = "/run/istio-cni-node.lock"

// LockMachine blocks until no other node (test, demo) runs on this machine, and
// returns the function that releases the lock.
func LockMachine() (unlock func(), err error) {
	f, err := os.OpenFile(MachineLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node machine lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("node machine lock %s: %w", MachineLockPath, err)
	}
	return func() { f.Close() }, nil
}
