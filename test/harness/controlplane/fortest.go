package controlplane

import (
	"testing"

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
