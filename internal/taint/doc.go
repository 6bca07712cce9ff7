// Package taint keeps a taint (cni.istio.io/not-ready:NoSchedule by default) on
// every node whose istio-cni agent pod is not Ready, and only on those, so that
// no pod is scheduled onto a node before the CNI can redirect its traffic. It is
// the way to avoid the race that package repair fixes after the fact: Istio's
// istio-cni-taint, and the istiod untaint controller's job, in one controller.
//
// One replica acts at a time, chosen by leader election on a
// coordination.k8s.io Lease; the others keep no watches open. Nodes usually get
// the taint when they register (kubelet --register-with-taints or a node
// provisioner's startup taints), which closes the window before the controller
// sees the node; the controller adds it otherwise, and removes it once the agent
// is Ready. It never adds it for a node whose agent is terminating (the plugin
// stays installed across a restart), and removes it from nodes no DaemonSet of
// the agent runs on and from nodes that leave its node selector. It records its
// taint key on the Lease (KeyAnnotation), and a leader configured with another key
// lifts the recorded one's taints from the nodes it manages. RemoveTaint is what an
// agent leaving its node for good calls on exit.
package taint
