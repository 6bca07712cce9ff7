// Package nftables is the native nftables capture backend. It owns the tables named
// istio-proxy-<netfilter table> in the ip and ip6 families (istio-proxy-nat,
// istio-proxy-mangle, istio-proxy-raw, istio-proxy-filter) and nothing else: other
// tables, including the ones iptables-nft maintains, are never read for decisions,
// flushed or changed.
//
// Render translates a redirect.Plan into an nft script written in exactly the form
// `nft list table` prints, so that the live rules can be verified by comparing text.
// Inside each table the plan's rules on the PREROUTING/OUTPUT hooks live in base
// chains named prerouting/output, and Istio's own chains keep their names
// (ISTIO_INBOUND, ISTIO_OUTPUT, ...) so existing debugging guides still apply.
//
// Backend applies a plan in one atomic transaction in the calling thread's network
// namespace, verifies it by listing our tables back, and removes our tables on
// cleanup.
package nftables
