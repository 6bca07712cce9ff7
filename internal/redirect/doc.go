// Package redirect is the capture model: Spec, every setting of Istio's sidecar
// capture in typed and validated form (Set parses Istio's string forms of flags,
// variables and annotations straight into it; Validate checks it as a whole), and
// Build, the one pure function that turns a Spec into a Plan: the ordered chains
// and rules per address family and table. Every capture decision is made here;
// the backends (iptables, nftables) only translate a Plan, and CHECK compares the
// live rules with it. README.md beside this file draws where packets go.
package redirect
