// Package plugin is the istio-cni CNI plugin: its configuration (Istio's current
// and legacy formats, decoded, defaulted and validated), the commands ADD, CHECK,
// DEL, STATUS, GC and VERSION, and PlanFor, the one path from a pod to its rules
// (the selection in Istio's order, with the refusal of ambient pods by their own or
// their namespace's label, the capture spec from the pod's annotations and
// proxy container, and the plan built from it) that repair and the doctor call too.
// The pure parts (config, selection, spec) touch neither the network nor the API
// server; the commands wire them to the runtime, the API client and a backend.
package plugin
