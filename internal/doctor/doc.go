// Package doctor answers "is this pod's traffic redirected, and if not, why?". It
// reuses the plugin's own decision and capture code, so what it reports is what the
// plugin does: Explain works offline on a pod manifest; the node-side commands read
// the live rules in the pod's network namespace.
package doctor
