// Package repair finds this node's meshed pods that started without traffic
// redirection (the CNI race: the pod was scheduled before the istio-cni agent was
// ready on the node, so its istio-validation init container failed) and fixes them:
// by programming the capture into the running pod's network namespace through the
// plugin's own path, by deleting the pod so it is recreated with the plugin in
// place, or by labelling it for an operator. In Multus mode a pod whose networks
// annotation does not name the plugin is not the race: it is labelled and reported
// once, never deleted.
//
// It owns the detection rule (Broken), the settings (Config, with Istio's
// REPAIR_* environment variable names), the controller (an informer limited to
// this node's pods, a rate-limited work queue, events and counters) and the search
// for a running pod's network namespace (NetnsFinder). README.md lists the RBAC
// each setting needs.
package repair
