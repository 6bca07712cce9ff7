// Package probe owns live probing of redirection: real connections made in a pod's
// network namespace (under a chosen uid and gid when asked), caught by listeners on
// the ports the capture sends traffic to, and the destination each connection had
// before NAT redirected it (OriginalDst, SO_ORIGINAL_DST for IPv4 and IPv6).
//
// It reports what happened and judges nothing: istio-iptables --run-validation and
// istio-cni-doctor probe each decide what an outcome means and word it for their
// readers. The test harness reads original destinations with OriginalDst too, so
// the tests exercise the code the shipped commands run.
package probe
