// Package iptables is the iptables capture backend: it renders a redirect.Plan as
// iptables-restore input (one restore per family, applied atomically, legacy or nft
// flavour), owns the ISTIO_* chains and the one jump from each built-in chain, reads
// the live rules back with iptables-save to verify them against the plan, and
// removes exactly what it added.
package iptables
