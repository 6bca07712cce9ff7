// Package iptables is the iptables capture backend: it renders a redirect.Plan as
// iptables-restore input (one restore per family, each table committed whole, legacy
// or nft flavour; a restore that fails at a later table keeps the earlier ones, which
// capture.Apply then puts back as the apply found them: revertText), owns the ISTIO_*
// chains and the one jump from each built-in chain, reads the live rules back with
// iptables-save to verify them against the plan, and
// removes exactly what it added, plus, in a namespace Istio's own istio-iptables
// programmed, the rules of the fixed forms Istio writes straight into built-in
// chains (istioforms.go) and nothing else. In nft mode, rules for a namespace that holds no
// table yet (a pod's new one, every ADD) are sent as the netlink batch
// iptables-nft-restore would send, without its process (native_linux.go); what
// that translation does not cover is restored. For a pod with hostUsers: false,
// whose network namespace belongs to its own user namespace, every tool runs in
// that user namespace too (podUserNamespace): the kernel takes owner matches only
// from there.
package iptables
