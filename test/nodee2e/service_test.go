package nodee2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// The node runs kube-proxy. A meshed pod calling a Service's ClusterIP is captured
// inside the pod, before the node translates the address: its proxy reads the
// Service's address as the original destination (what Envoy routes on), and the
// call reaches the app, through the app's proxy, at the pod's own address.
func TestServiceTrafficIsCapturedWithTheServiceAddress(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	install(t, s, values(t))

	web := meshnode.MeshedPod("svc", "web")
	web.Labels["svc"] = "web"
	pods := createPods(t, web, meshnode.MeshedPod("svc", "caller"))
	web, caller := pods[0], pods[1]

	svc, err := theNode.Client().CoreV1().Services("svc").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "svc", Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"svc": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		theNode.Client().CoreV1().Services("svc").Delete(context.Background(), "web", metav1.DeleteOptions{})
	})
	vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80).String()

	// kube-proxy programs the Service once its EndpointSlice is there.
	var answer string
	waitFor(t, "the Service "+vip+" answers", 30*time.Second, func() bool {
		answer, err = s.RequestTo(ctx, caller, vip)
		return err == nil && strings.Contains(answer, "hello from web")
	})
	if !strings.Contains(answer, "127.0.0.6") {
		t.Errorf("answer %q: want it seen from 127.0.0.6 (the app's proxy's inbound passthrough)", answer)
	}
	callerLog, _ := s.ProxyLog(ctx, caller)
	if !contains(meshnode.Forwarded(callerLog, "outbound"), vip) {
		t.Errorf("caller's proxy log has no outbound %s (the Service address):\n%s", vip, callerLog)
	}
	podAddr := web.Status.PodIP + ":8080"
	webLog, _ := s.ProxyLog(ctx, web)
	if !contains(meshnode.Forwarded(webLog, "inbound"), podAddr) {
		t.Errorf("web's proxy log has no inbound %s:\n%s", podAddr, webLog)
	}
}
