// Package sandbox builds throwaway test hosts on this machine for the real-traffic
// tests and the demo: a "pod" and a "peer" network namespace joined by veth, with
// IPv4 and IPv6, listeners that report the original destination of what they
// accept (SO_ORIGINAL_DST), and probes that connect under a chosen uid. Traffic stays
// inside these namespaces.
package sandbox
