// Package plugin holds the istio-cni CNI plugin's pure logic: its configuration
// (Istio's current and legacy formats, decoded, defaulted and validated), the pod
// selection in Istio's order (Decide), and the capture spec built from a selected
// pod (SpecFromPod). Nothing here touches the network, execs or calls the API
// server; the command wires these to the runtime, the API client and a backend.
package plugin
