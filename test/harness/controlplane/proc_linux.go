package controlplane

import (
	"syscall"
)

// processGone reports whether no process with this pid exists any more.
func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}
