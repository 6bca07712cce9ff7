package controlplane

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/istio-cni/istio-cni/test/harness/childproc"
)

// StartForTest starts a control plane for t and stops it when t ends. Missing
// binaries are a failure, never a skip: a test that silently does not run proves
// nothing. If t failed, the end of each server log is written to t first, because
// Stop deletes the logs.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	cp, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*childproc.Process{cp.etcd, cp.apiserver} {
				t.Logf("last lines of %s:\n%s", p.LogPath, p.Tail(40))
			}
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

// StartForTestWithNamespaces is StartForTest with namespaces created.
func StartForTestWithNamespaces(t testing.TB, opts Options, namespaces ...string) *ControlPlane {
	t.Helper()
	cp := StartForTest(t, opts)
	for _, ns := range namespaces {
		if err := cp.EnsureNamespace(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	return cp
}

// ServiceAccountConfigForTest is the client configuration of the ServiceAccount
// namespace/name holding exactly rules (see ServiceAccountKubeconfig); an error
// fails t.
func (c *ControlPlane) ServiceAccountConfigForTest(t testing.TB, namespace, name string, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	path, err := c.ServiceAccountKubeconfig(t.Context(), namespace, name, rules)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load kubeconfig %s: %v", path, err)
	}
	return cfg
}

// ServiceAccountClientForTest is a client of the ServiceAccount namespace/name
// holding exactly rules; an error fails t.
func (c *ControlPlane) ServiceAccountClientForTest(t testing.TB, namespace, name string, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	return ClientForTest(t, c.ServiceAccountConfigForTest(t, namespace, name, rules))
}

// ClientForTest is a clientset for cfg; an error fails t.
func ClientForTest(t testing.TB, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client for %s: %v", cfg.Host, err)
	}
	return cs
}

// KubeconfigClientForTest is ClientFromKubeconfig for a test; an error fails t.
func KubeconfigClientForTest(t testing.TB, path string) kubernetes.Interface {
	t.Helper()
	cs, err := ClientFromKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
