package doctor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInClusterKubeconfigTakesTheHostAsTheAgentDoes: the API server's address from
// KUBERNETES_SERVICE_HOST becomes one URL however it is written. Before, an IPv6
// address given with its brackets (which the agent's --kubernetes-service-host
// takes) got a second pair, "https://[[fd00::1]]:443", which no client can dial.
func TestInClusterKubeconfigTakesTheHostAsTheAgentDoes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("ca"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ host, want string }{
		{"10.96.0.1", "https://10.96.0.1:443"},
		{"kubernetes.default.svc", "https://kubernetes.default.svc:443"},
		{"fd00:10:96::1", "https://[fd00:10:96::1]:443"},
		{"[fd00:10:96::1]", "https://[fd00:10:96::1]:443"},
	} {
		env := map[string]string{"KUBERNETES_SERVICE_HOST": tc.host, "KUBERNETES_SERVICE_PORT": "443"}
		kc, err := inClusterKubeconfigFrom(func(k string) string { return env[k] }, dir)
		if err != nil {
			t.Fatalf("%s: %v", tc.host, err)
		}
		if kc.Server != tc.want {
			t.Errorf("KUBERNETES_SERVICE_HOST=%s: server %q, want %q", tc.host, kc.Server, tc.want)
		}
		if kc.TokenFile != filepath.Join(dir, "token") || string(kc.CAData) != "ca" {
			t.Errorf("KUBERNETES_SERVICE_HOST=%s: token file %q, CA %q: not the service account's", tc.host, kc.TokenFile, kc.CAData)
		}
	}
}
