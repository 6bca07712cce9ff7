// Package capture applies, verifies and removes a redirect plan in a network
// namespace: the rules through a Backend (iptables or native nftables) and, for
// TPROXY and IPv6, the policy routing and the inbound passthrough address through
// netlink. It is the one entry point the plugin, the repair path and istio-iptables use.
package capture
