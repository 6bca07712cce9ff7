// Package trace answers "where does this packet land?" for a redirect.Plan, by walking
// the plan's final chains the way netfilter does: {src, dst, dport, uid, interface,
// marks, conntrack state} -> passed, redirected or tproxied to a port, or dropped.
// Tests use it to check what a plan means rather than how it is spelled, and the
// real-kernel tests in internal/capture hold its verdicts against live traffic. It is
// test harness: no shipped binary imports it.
package trace
