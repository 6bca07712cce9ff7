package nodee2e

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// The node's pods are dual-stack (IPv4 first). A pod whose istio-proxy says
// ISTIO_DUAL_STACK=true is captured in both families: ip6tables holds the ISTIO
// chains, and a request to the app's IPv6 address goes out through the client's
// proxy and in through the app's, both reading the original IPv6 destination, and
// the app sees it come from the proxy's IPv6 inbound passthrough address ::6. A
// meshed pod without it is captured over IPv4 only, as in Istio.
func TestDualStackPodsAreCapturedOverIPv6(t *testing.T) {
	s := session(t)
	install(t, s, values(t))

	pods := createPods(t, meshnode.DualStack(meshnode.MeshedPod("dualstack", "client")),
		meshnode.DualStack(meshnode.MeshedPod("dualstack", "app")), meshnode.MeshedPod("dualstack", "v4only"))
	client, app, v4only := pods[0], pods[1], pods[2]

	v6 := func(p *corev1.Pod) netip.Addr {
		t.Helper()
		a := meshnode.PodIPv6(p)
		if !a.IsValid() {
			t.Fatalf("pod %s has no IPv6 address: %v (the node is dual-stack)", p.Name, p.Status.PodIPs)
		}
		return a
	}
	if a, err := netip.ParseAddr(app.Status.PodIP); err != nil || !a.Is4() {
		t.Errorf("app's primary address %q, want IPv4 (IPv4 first)", app.Status.PodIP)
	}
	appV6 := v6(app)
	v6(client)

	for _, p := range []*corev1.Pod{client, app} {
		if rules := podExec(t, p, "ip6tables-nft-save", "-t", "nat"); !meshnode.Captured(rules) {
			t.Errorf("pod %s: no IPv6 capture:\n%s", p.Name, rules)
		}
	}
	if rules := podExec(t, v4only, "ip6tables-nft-save", "-t", "nat"); meshnode.HasIstioRules(rules) {
		t.Errorf("pod %s without ISTIO_DUAL_STACK has IPv6 rules:\n%s", v4only.Name, rules)
	}

	checkRequestThroughProxies(t, s, client, app, netip.AddrPortFrom(appV6, 8080).String(), "[::6]")
}
