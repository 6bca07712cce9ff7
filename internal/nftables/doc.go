// Package nftables is the native nftables capture backend. It owns the tables named
// istio-proxy-<netfilter table> in the ip and ip6 families (istio-proxy-nat,
// istio-proxy-mangle, istio-proxy-raw, istio-proxy-filter) and nothing else: other
// tables, including the ones iptables-nft maintains, are never read for decisions,
// flushed or changed.
//
// A redirect.Plan is translated once into a normalized ruleset (see translate).
// From it Render prints an nft script in exactly the form `nft list table` prints
// (the goldens, and the nft -f write path), and ruleExprs encodes each rule as
// netlink expressions. Inside each table the plan's rules on the
// PREROUTING/OUTPUT hooks live in base chains named prerouting/output, and Istio's
// own chains keep their names (ISTIO_INBOUND, ISTIO_OUTPUT, ...) so existing
// debugging guides still apply.
//
// Backend applies a plan in one atomic transaction in the calling thread's network
// namespace and removes our tables on cleanup. When the rest of an apply fails after
// the transaction (capture.Apply's routing), its rollback writes back, in one
// transaction too, the tables the apply found (rulesetOf). An apply holds the
// namespace's apply lock (applylock) from before its read until capture.Apply's
// routing and rollback are done, so that no other apply into the namespace
// writes in between. Apply, Verify and Cleanup read the
// live tables over netlink, never by parsing nft's text, which changes between nft
// versions: decodeRule turns each rule's expressions back into the typed rule they
// encode, and rules are compared as such, so handles, counters and comments do
// not matter and any other change does. No nft binary is needed; where one is
// installed the default backend runs it only to explain a batch the kernel refused.
package nftables
