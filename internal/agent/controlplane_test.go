package agent

import (
	"context"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/controlplane"
	"github.com/istio-cni/istio-cni/internal/kube"
)

func TestKubeconfigFromARealServiceAccountLetsThePluginGetPodsAndNothingElse(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// The agent's ServiceAccount, with the RBAC of Istio's chart for the plugin: get pods.
	saKubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "istio-system", "istio-cni", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kube.LoadKubeconfig(saKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t)
	n.rotateToken(t, sa.Token) // what the kubelet projects into the agent's pod
	writeFile(t, filepath.Join(n.saDir, "ca.crt"), cp.CAData(), 0o644)
	u, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}

	p := n.startAgent(t, "KUBERNETES_SERVICE_HOST="+u.Hostname(), "KUBERNETES_SERVICE_PORT="+u.Port(),
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=istio-system")
	p.waitReady(t)

	if err := cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps"},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		},
	}
	if _, err := cp.AdminClient().CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The runtime runs the installed plugin with the installed config; the plugin
	// reads the agent's kubeconfig and looks the pod up.
	conf, err := libcni.ConfFromFile(filepath.Join(n.confDir, "istio-cni.conf"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{
		ContainerID: "feedfacecafe0001", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}},
	}
	if _, err := libcni.NewCNIConfig([]string{n.binDir}, nil).AddNetwork(ctx, conf, rt); err != nil {
		t.Fatalf("ADD with the agent's kubeconfig: %v", err)
	}
	eventually(t, 10*time.Second, "the plugin's decision on the fetched pod reaches the agent", func() bool {
		return strings.Contains(p.stdout.String(), `"pod":"apps/web"`) &&
			strings.Contains(p.stdout.String(), `"msg":"ADD: pod passed through"`)
	})
	t.Logf("agent stdout:\n%s", p.stdout.String())
	if v := p.metric(t, `istio_cni_plugin_events_total{command="ADD",outcome="passed_through"}`); v != 1 {
		t.Errorf("ADD passed_through = %v, want 1", v)
	}

	// And nothing else: the same kubeconfig, as the plugin's client reads it.
	kc, err := kube.LoadKubeconfig(filepath.Join(n.runDir, "istio-cni-kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClient(kc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := c.Get(ctx, kube.PodPath("apps", "web"), &obj); err != nil {
		t.Errorf("get pod: %v", err)
	}
	for _, path := range []string{
		"/api/v1/namespaces/apps/pods",        // list pods
		"/api/v1/pods",                        // list pods everywhere
		"/api/v1/namespaces/apps/secrets/any", // get a secret
		"/api/v1/nodes/node-1",                // get a node
		"/api/v1/namespaces/istio-system/serviceaccounts/istio-cni",
	} {
		err := c.Get(ctx, path, &obj)
		var st *kube.StatusError
		if !errors.As(err, &st) || st.Code != 403 {
			t.Errorf("GET %s with the plugin's kubeconfig: %v, want 403 Forbidden", path, err)
		}
	}
}
