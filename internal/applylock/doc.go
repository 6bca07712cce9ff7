// Package applylock owns the namespace's apply lock: it serialises the applies
// of a capture into one network namespace, whichever process runs them (the
// plugin's ADD, a runtime's retry of it while the first still runs, a second
// ADD for the same sandbox, the agent's repair in place, istio-iptables) and
// whichever backend writes the rules. An apply reads what the namespace holds,
// writes the rules, sets up the routing and, when a step fails, puts back the
// rules it found and removes the routing it added: two at once would each take
// the other's state for what they found, and the rollback of one would undo
// what the other has since written and reported done. The backends take the
// lock before they read and capture.Apply lets it go after the routing and the
// rollback.
//
// The lock is an flock of the network namespace itself: of its nsfs file,
// which every path to the namespace opens (the runtime's bind mount under
// /var/run/netns, /proc/PID/ns/net from the agent's container, the calling
// thread's own), so it is one lock per namespace and never one for the node (a
// pod's apply never waits for another pod's), and it needs no directory shared
// between the plugin and the agent, no file made or written on the apply's
// path, and no clean-up: the kernel drops it with the last descriptor of a
// holder that dies. It is taken without blocking and tried again, so that the
// wait has a bound of its own (WaitBound) besides the caller's; a waiter that
// gives up names the holder, as /proc/locks lists it.
package applylock
