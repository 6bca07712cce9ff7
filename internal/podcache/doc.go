// Package podcache serves the node's pods to the plugin from the node agent's watch.
// The plugin is exec'd for every pod and must look the pod up before programming
// its capture; asking the agent over a unix socket costs well under a millisecond,
// against several for a TLS round trip to the API server, and keeps a burst of pod
// starts off the API server. The agent watches only its own node's pods (a field
// selector on spec.nodeName), so its memory does not grow with the cluster.
//
// It also serves the cluster's namespaces (name and labels only): for a pod without
// a sidecar, the namespace's istio.io/dataplane-mode label decides whether it is an
// ambient pod, which the plugin refuses. Namespaces are few, so watching them all
// costs little, and the plugin's common path then makes no API request.
//
// It also keeps one file per pod of the node (kube.AgentPodFilesDir in the run
// directory, root's alone, replaced whole by a rename, removed with the pod and
// when the agent stops), the JSON the socket answers with the format's version
// (kube.AgentPodFileVersion). The plugin reads its pod there first: a file read
// needs no request, so the plugin never waits for this process to be scheduled,
// which on a node starting many pods at once set the slowest ADDs. The socket
// serves what the files do not hold (a pod whose event has not arrived yet,
// namespaces).
//
// A file is only as current as the process that rewrites it, and one that dies
// without stopping (SIGKILL, the OOM killer) leaves its files behind, unchanged
// when the pod's annotations change. So the agent holds a lock on the files'
// directory (kube.AgentPodFilesLock) while it keeps them: from the moment every
// pod its watch listed is written until it stops, the kernel dropping it when the
// process dies. The plugin reads no file without that lock held, nor a file of
// another format version (an agent of another build during an upgrade); either
// way it asks the socket, then the API server, as for a missing file. The lock
// says that the process keeping the files runs, not that its watch is current to
// the moment: a watch that breaks (the API server restarting) is resumed or listed
// again by client-go, whose events then rewrite the files as they update the
// socket's answers, both lagging alike meanwhile.
//
// The cache is an accelerator, never the authority: a pod the cache does not hold
// (not yet seen, or another UID than the sandbox's), or a namespace it does not hold
// (not yet seen, or its watch not synced, e.g. without RBAC to list namespaces), is
// read from the API server. Like any watch it may lag a change by moments: a label
// added to a namespace applies to the pods the plugin sets up once the watch has
// seen it, as with Istio's own node agent.
package podcache
