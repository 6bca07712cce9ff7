// Package scale simulates a large cluster around real install-cni agents: a real
// kube-apiserver and etcd hold Node objects and pods placed on them (spec.nodeName
// and status set directly: no scheduler, no kubelet), real install-cni processes
// run as the agents of some of those nodes with the pod cache, repair and the taint
// election on, and each agent reaches the API server through its own counting proxy.
// The tests assert what keeps an agent's cost independent of the cluster's size;
// the benchmark prints what an agent and the API server spend, at rest and while
// pods churn, for two cluster sizes.
package scale
