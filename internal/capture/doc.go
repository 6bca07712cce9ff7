// Package capture applies, verifies and removes a redirect plan in a network
// namespace: the rules through a Backend (iptables or native nftables) and, for
// TPROXY and IPv6, the policy routing and the inbound passthrough address through
// netlink. It is the one entry point the plugin, the repair path and istio-iptables use.
//
// An apply that fails puts the namespace back as it found it (Apply): the rules
// go back to those the backend read before it wrote them, the capture of an
// earlier apply to the same pod included (ours are removed where there were
// none), and the routing entries it added are removed, only those. The backend's
// apply lock of the namespace (applylock) is held from before the backend reads
// the rules until the routing and the rollback are done: another apply into the
// namespace never writes in between. Cleanup, the plugin's DEL, removes every rule
// and routing entry of ours, whoever added them, holding the same lock
// exclusive; Verify and Check hold it shared, so they never read an apply or a
// removal half done (applylock's doc says why shared), and Read holds it shared
// for a reader of several things (the doctor) that shows them as of one
// moment. ApplyAndVerify verifies what it applied under the apply's own hold of
// the lock.
package capture
