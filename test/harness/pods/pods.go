// Package pods builds the pod manifests the tests create: pods as Istio's injector
// shapes them.
package pods

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Option changes a pod before it is returned.
type Option func(*corev1.Pod)

// Injected is a pod as Istio's injector shapes it with the CNI enabled: the
// sidecar status annotation, the istio-validation init container and an
// istio-proxy sidecar beside an app container, on node.
func Injected(namespace, name, node string, opts ...Option) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Annotations: map[string]string{"sidecar.istio.io/status": `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`},
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			InitContainers: []corev1.Container{{
				Name: "istio-validation", Image: "proxyv2",
				Args: []string{"istio-iptables", "--run-validation", "--skip-rule-apply"},
			}},
			Containers: []corev1.Container{
				{Name: "app", Image: "app"},
				{Name: "istio-proxy", Image: "proxyv2", Args: []string{"proxy", "sidecar"}},
			},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}
