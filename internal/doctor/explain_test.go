package doctor

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// TestExplainGolden runs `explain` on every pod manifest the plugin's own tests use
// (meshed, skipped for each reason, invalid, ambient), with its namespace's manifest
// when the plugin's tests have one, with both backends and both formats, and
// compares with golden files. The exit code is 1 exactly for pods whose ADD would
// fail.
func TestExplainGolden(t *testing.T) {
	pods, err := filepath.Glob(filepath.Join("..", "plugin", "testdata", "pods", "*.json"))
	if err != nil || len(pods) < 10 {
		t.Fatalf("pod manifests: %v (%d found)", err, len(pods))
	}
	for _, pod := range pods {
		name := strings.TrimSuffix(filepath.Base(pod), ".json")
		for _, variant := range []struct{ suffix, backend, format string }{
			{"txt", "iptables", "text"}, {"nft.txt", "nftables", "text"}, {"json", "iptables", "json"},
		} {
			t.Run(name+"/"+variant.suffix, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				args := []string{"explain", "-f", pod, "-backend", variant.backend, "-o", variant.format, "-exclude-namespaces", "istio-system,kube-system"}
				if ns := podNamespaceFile(t, pod); ns != "" {
					args = append(args, "-namespace", ns)
				}
				code := Main(args, nil, &stdout, &stderr)
				wantFail := strings.HasPrefix(name, "bad-") || name == "ambient-namespace" || name == "ambient-pod-label"
				if (code != 0) != wantFail {
					t.Errorf("exit code %d (stderr %q)", code, stderr.String())
				}
				golden.Check(t, filepath.Join("testdata", "explain", name+"."+variant.suffix+".golden"), stdout.Bytes())
			})
		}
	}
}

func TestExplainRejectsBadUsage(t *testing.T) {
	dir := t.TempDir()
	notPod := filepath.Join(dir, "svc.yaml")
	os.WriteFile(notPod, []byte("kind: Service\nmetadata: {name: x}\n"), 0o644)
	garbage := filepath.Join(dir, "garbage.yaml")
	os.WriteFile(garbage, []byte("\t: ["), 0o644)
	podFile := filepath.Join("..", "plugin", "testdata", "pods", "no-sidecar.json")
	otherNS := filepath.Join(dir, "other.yaml")
	os.WriteFile(otherNS, []byte("kind: Namespace\nmetadata: {name: other}\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"explain"}, 2, "-f POD.yaml is required"},
		{[]string{"explain", "-f", notPod}, 1, "a Service, not a Pod"},
		{[]string{"explain", "-f", garbage}, 1, "not YAML or JSON"},
		{[]string{"explain", "-f", notPod, "-backend", "ebpf"}, 2, `-backend "ebpf"`},
		{[]string{"explain", "-f", filepath.Join(dir, "missing.yaml")}, 1, "no such file"},
		{[]string{"explain", "-f", podFile, "-namespace", notPod}, 1, "a Service, not a Namespace"},
		{[]string{"explain", "-f", podFile, "-namespace", otherNS}, 1, "namespace other is not the pod's (default)"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(tc.args, nil, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// podNamespaceFile is the plugin's testdata manifest of the pod's namespace, "" when
// there is none.
func podNamespaceFile(t *testing.T, podFile string) string {
	t.Helper()
	data, err := os.ReadFile(podFile)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := DecodePod(data)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join("..", "plugin", "testdata", "namespaces", pod.Metadata.Namespace+".json")
	if _, err := os.Stat(file); err != nil {
		return ""
	}
	return file
}
