// Package istioiptables is the istio-iptables command: Istio's flags and environment
// variables parsed into a typed Config (ParseConfig), the facts Istio takes from the
// pod's environment (proxy uid, IPv6, DNS servers), and Run, which builds the capture
// plan and prints it (--dry-run), applies it, removes it (--cleanup-only) or checks
// that the pod's traffic really is redirected (--run-validation, the job of Istio's
// istio-validation init container when istio-cni programs the pod).
//
// It decides nothing about rules itself: the plan comes from redirect.Build and is
// applied through capture with the iptables or nftables backend.
package istioiptables
