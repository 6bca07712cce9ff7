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
// The capture's removal (capture.Cleanup: the plugin's DEL, istio-iptables'
// clean) takes it too, exclusive (Take), for its rules and its routing: run
// during an apply it removed rules that the apply then reported done, or the
// apply's rollback put back rules it had removed, or the apply added its
// routing after the removal and left it without its rules. Its reads
// (capture.Verify, capture.Check and capture.Read: the plugin's CHECK, the
// agent's repair in place, the doctor, istio-iptables) take it shared (TakeShared): a read
// between two steps of an apply (one family's rules, the other's, the routing,
// a rollback) reported differences that the apply's end removed, in TPROXY
// mode the rules without their routing, and CHECK failed a healthy pod. Shared,
// because a read changes nothing that another read sees: two CHECKs, or a
// CHECK and the doctor, never wait for each other, and an apply or a removal
// still waits for them, as they wait for it (flock's shared and exclusive
// locks exclude each other, whichever process and descriptor holds them). An
// apply waiting on readers that keep coming could wait for ever in principle;
// a read holds the lock for milliseconds and reads are rare (a CHECK per
// sandbox start, an inspection), and the wait is bounded (WaitBound) anyway.
// A read and a removal wait as an apply does, within WaitBound and the
// caller's bound, and fail with the same HeldError naming the holder, never
// with what they read meanwhile.
//
// A process that holds the lock must not take it again through another open
// file description of the namespace (another open of its path): flock locks
// per open file description, so the second waits for the first, held by the
// same process, until its bound runs out. So nothing takes it while it is
// held: the backends' rollbacks and capture.Apply's routing run under the
// apply's own hold, and a caller that verifies what it applied (istio-iptables,
// the agent's repair in place) does it under the same hold
// (capture.ApplyAndVerify), which also keeps another apply or removal from
// coming between the two. The ADD verifies nothing after its apply; the DEL
// and the doctor only remove or read; the doctor reads all it shows (the live
// rules, their differences, the other backend's stray rules) under one hold
// (capture.Read), so that they are of one moment.
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
