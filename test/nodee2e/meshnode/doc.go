// Package meshnode installs istio-cni with its Helm chart on a real local node
// (test/harness/node: kubelet + containerd) and runs meshed sample pods on it: the
// images built without a Docker engine (hack/image), the chart installed with
// the node's CNI directories, pods carrying the istio-proxy stand-in
// (test/harness/cmd/proxy-standin) and the annotations Istio's injector writes, and the checks
// that read the rules in a pod's network namespace and the proxy's log. `make demo`
// (hack/demo) and the end-to-end tests (test/nodee2e) share it.
package meshnode
