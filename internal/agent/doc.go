// Package agent is the install-cni node agent, the long-running program of the
// istio-cni-node DaemonSet. It owns the agent's settings (flags and Istio's
// environment variables), putting the plugin on the node (binaries copied
// atomically, a kubeconfig from the agent's ServiceAccount, the plugin's entry in the
// node's CNI config through internal/cniconf), keeping it there while anything
// else rewrites those files (fsnotify, no polling), collecting the plugin's log
// records over a unix datagram socket, the health, readiness and metrics endpoints,
// and removing everything again on shutdown. It also runs, against the API server,
// the parts that live in other packages: the pod cache the plugin asks first
// (internal/podcache), the repair controller (internal/repair) and the node readiness
// taint (internal/taint); none of them gates readiness.
//
// The node's CNI config is what every pod on the node depends on: the agent never
// writes a partial file, never edits a file it cannot parse (it reports the file and
// the problem and waits for the next change), and after install then uninstall the
// config dir holds what it held before.
package agent
