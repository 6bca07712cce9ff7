// Package podcache serves the node's pods to the plugin from the node agent's watch.
// The plugin is exec'd for every pod and must look the pod up before programming
// its capture; asking the agent over a unix socket costs well under a millisecond,
// against several for a TLS round trip to the API server, and keeps a burst of pod
// starts off the API server. The agent watches only its own node's pods (a field
// selector on spec.nodeName), so its memory does not grow with the cluster.
//
// The cache is an accelerator, never the authority: a pod the cache does not hold
// (not yet seen, or another UID than the sandbox's) is read from the API server.
package podcache
