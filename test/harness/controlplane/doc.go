// Package controlplane starts and stops a real, throwaway Kubernetes control plane
// (etcd and kube-apiserver, no controllers, no scheduler, no kubelet) on this machine
// for tests and for hack/controlplane.sh.
//
// It owns everything the two processes need: locating (or building, through
// hack/kube-binaries.sh) the binaries, a private CA with serving and client
// certificates, the service-account signing key pair, free loopback ports, log
// files, readiness, and a teardown that leaves neither processes nor files behind.
//
// Because no kube-controller-manager runs, nothing creates the "default"
// ServiceAccount of a namespace, and pods cannot be admitted without it: use
// EnsureNamespace rather than creating namespaces directly. Because no scheduler
// runs, pods need spec.nodeName.
//
// ServiceAccountKubeconfig gives a test what the CNI plugin gets on a node: a real
// ServiceAccount token from the TokenRequest API, limited by RBAC to exactly the
// rules the test names.
//
// PauseAPIServer and ResumeAPIServer hang the apiserver (SIGSTOP, SIGCONT);
// StopAPIServer and StartAPIServer take it away and bring it back on the same port
// and etcd, with an empty watch cache (AdvanceRevision, while it is stopped, makes
// it answer a watch resumed from before 410 Gone): the API server failures a node's
// agent must ride out.
package controlplane
