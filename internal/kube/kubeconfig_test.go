package kube

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

func TestParseKubeconfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("CA-FROM-FILE"), 0o600); err != nil {
		t.Fatal(err)
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name    string
		in      string
		want    *Kubeconfig
		wantErr string
	}{
		{
			name: "the agent's YAML kubeconfig with token and inline CA",
			in: `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://10.0.0.1:443
    certificate-authority-data: ` + b64("CA") + `
users:
- name: istio-cni
  user:
    token: abc
contexts:
- name: ctx
  context: {cluster: local, user: istio-cni}
current-context: ctx
`,
			want: &Kubeconfig{Server: "https://10.0.0.1:443", CAData: []byte("CA"), Token: "abc"},
		},
		{
			name: "JSON with a relative CA file and a token file",
			in:   `{"clusters":[{"name":"c","cluster":{"server":"https://k:6443","certificate-authority":"ca.crt"}}],"users":[{"name":"u","user":{"tokenFile":"/var/run/token"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			want: &Kubeconfig{Server: "https://k:6443", CAData: []byte("CA-FROM-FILE"), TokenFile: "/var/run/token"},
		},
		{
			name:    "missing context",
			in:      `{"clusters":[{"name":"a","cluster":{"server":"https://a"}},{"name":"b","cluster":{"server":"https://b"}}],"current-context":"nope"}`,
			wantErr: `current context "nope" not found`,
		},
		{
			name:    "bad base64",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://k","certificate-authority-data":"***"}}]}`,
			wantErr: "certificate-authority: not base64",
		},
		{name: "not a kubeconfig", in: "\t- : [", wantErr: "not YAML or JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKubeconfig([]byte(tc.in), dir)
			if tc.wantErr != "" {
				wanterr.Mentions(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadKubeconfigRefusesFilesOverTheBound: a kubeconfig, or a file it names,
// larger than MaxFileBytes is refused naming the file; one at the bound is read.
func TestLoadKubeconfigRefusesFilesOverTheBound(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid := "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.pem\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user: {token: t}\n"
	// A kubeconfig padded with a comment to exactly the bound is read.
	pad := MaxFileBytes - len(valid) - 2
	atBound := write("at-bound", []byte(valid+"#"+strings.Repeat("x", pad)+"\n"))
	write("ca.pem", []byte("ca"))
	if _, err := LoadKubeconfig(atBound); err != nil {
		t.Errorf("a kubeconfig of %d bytes: %v", MaxFileBytes, err)
	}
	over := write("over", []byte(valid+"#"+strings.Repeat("x", pad+1)+"\n"))
	if _, err := LoadKubeconfig(over); err == nil || !strings.Contains(err.Error(), over) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a kubeconfig over the bound: %v, want a refusal naming %s", err, over)
	}
	// A named file over the bound (the CA) is refused naming it.
	bigCA := write("big-ca.pem", make([]byte, MaxFileBytes+1))
	kc := write("names-big-ca", []byte(strings.Replace(valid, "ca.pem", bigCA, 1)))
	if _, err := LoadKubeconfig(kc); err == nil || !strings.Contains(err.Error(), bigCA) {
		t.Errorf("a CA file over the bound: %v, want a refusal naming %s", err, bigCA)
	}
}
