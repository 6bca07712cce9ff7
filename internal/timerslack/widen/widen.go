// Package widen sets the timer slack of the process's threads to Slack when it
// is initialised (timerslack.Widen): a short-lived command's main package imports
// it for that effect alone, as the CNI plugin does, so that it happens early in
// the process's initialisation rather than at the top of main. The package needs
// only syscall, errors and strconv, so it is initialised before the heavier
// packages (crypto, TLS, netlink).
//
// A failure (no CAP_SYS_NICE, no /proc) leaves the kernel's default slack (50
// us) and is kept in Err; the plugin logs it at debug in every command.
package widen

import "github.com/istio-cni/istio-cni/internal/timerslack"

// Slack is the timer slack set, in nanoseconds: the Go runtime's monitor then
// wakes every few milliseconds instead of every 20 us. The plugin's shortest
// timed wait is its lookup's retry interval, 1 s by default.
const Slack = 5_000_000

// Threads is how many threads were set, and Err the failure, if any.
var (
	Threads int
	Err     error
)

func init() {
	Threads, Err = timerslack.Widen(Slack)
}
