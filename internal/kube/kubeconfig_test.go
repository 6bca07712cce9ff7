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
		wantErr []string
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
			name: "the current context's user and cluster, not the others'",
			in: `{"clusters":[{"name":"a","cluster":{"server":"https://a"}},{"name":"b","cluster":{"server":"https://b","tls-server-name":"api.b"}}],` +
				`"users":[{"name":"plugin","user":{"exec":{"command":"aws"}}},{"name":"u","user":{"token":"t"}}],` +
				`"contexts":[{"name":"x","context":{"cluster":"a","user":"plugin"}},{"name":"y","context":{"cluster":"b","user":"u"}}],"current-context":"y"}`,
			want: &Kubeconfig{Server: "https://b", TLSServerName: "api.b", Token: "t"},
		},
		{
			name: "a byte order mark before the first key, current-context",
			in:   "\ufeffcurrent-context: b\nclusters:\n- name: c\n  cluster: {server: https://k}\ncontexts:\n- name: a\n  context: {cluster: c, user: ua}\n- name: b\n  context: {cluster: c, user: ub}\nusers:\n- name: ua\n  user: {token: A}\n- name: ub\n  user: {token: B}\n",
			want: &Kubeconfig{Server: "https://k", Token: "B"},
		},
		{
			name: "an empty current-context with one context means it",
			in:   `{"clusters":[{"name":"c","cluster":{"server":"https://k"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]}`,
			want: &Kubeconfig{Server: "https://k", Token: "t"},
		},
		{
			name: "a context with no user is anonymous, as for kubectl",
			in:   `{"clusters":[{"name":"c","cluster":{"server":"https://k"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c"}}],"current-context":"x"}`,
			want: &Kubeconfig{Server: "https://k"},
		},
		{
			name: "empty and null impersonation and credential plugin fields are no settings",
			in:   `{"clusters":[{"name":"c","cluster":{"server":"https://k","proxy-url":""}}],"users":[{"name":"u","user":{"token":"t","exec":null,"auth-provider":null,"username":"","as-groups":[],"as-user-extra":{}}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			want: &Kubeconfig{Server: "https://k", Token: "t"},
		},
		{
			name:    "missing context",
			in:      `{"clusters":[{"name":"a","cluster":{"server":"https://a"}},{"name":"b","cluster":{"server":"https://b"}}],"current-context":"nope"}`,
			wantErr: []string{`current-context "nope": no context of that name`},
		},
		{
			name:    "missing context with only one cluster (no fallback to it)",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t"}}],"current-context":"typo"}`,
			wantErr: []string{`current-context "typo": no context of that name`},
		},
		{
			name:    "no current-context and no context, one cluster (no fallback to it)",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t"}}]}`,
			wantErr: []string{"current-context is empty", "contexts holds 0"},
		},
		{
			name: "no current-context and two contexts",
			in: `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t"}}],` +
				`"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}},{"name":"y","context":{"cluster":"c","user":"u"}}]}`,
			wantErr: []string{"current-context is empty", "contexts holds 2"},
		},
		{
			name:    "a context's user that is not in users",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"typo"}}],"current-context":"x"}`,
			wantErr: []string{`context "x"`, `user "typo": no user of that name`},
		},
		{
			name:    "a context's cluster that is not in clusters",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"contexts":[{"name":"x","context":{"cluster":"typo"}}],"current-context":"x"}`,
			wantErr: []string{`context "x"`, `cluster "typo": no cluster of that name`},
		},
		{
			name:    "a cluster without a server",
			in:      `{"clusters":[{"name":"c","cluster":{}}],"contexts":[{"name":"x","context":{"cluster":"c"}}],"current-context":"x"}`,
			wantErr: []string{`cluster "c" has no server`},
		},
		{
			name:    "an exec credential plugin (EKS)",
			in:      "clusters:\n- name: c\n  cluster: {server: https://a}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
			wantErr: []string{`user "u": exec (command "aws"): not supported`, "token, tokenFile or client certificate"},
		},
		{
			name:    "an exec credential plugin beside a token",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t","exec":{"command":"gke-gcloud-auth-plugin"}}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": exec (command "gke-gcloud-auth-plugin"): not supported`},
		},
		{
			name:    "an auth provider",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"auth-provider":{"name":"oidc","config":{}}}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": auth-provider (name "oidc"): not supported`},
		},
		{
			name:    "basic authentication",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"username":"admin","password":"secret"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": username "admin": not supported`},
		},
		{
			name:    "a password alone",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"password":"secret"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": password: not supported`},
		},
		{
			name:    "impersonation",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t","as":"bob"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": as "bob": not supported`, "does not impersonate"},
		},
		{
			name:    "impersonated groups",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a"}}],"users":[{"name":"u","user":{"token":"t","as-groups":["g"]}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`user "u": as-groups ["g"]: not supported`},
		},
		{
			name:    "a proxy",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a","proxy-url":"http://me:pw@proxy:3128"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
			wantErr: []string{`cluster "c": proxy-url "http://me:xxxxx@proxy:3128": not supported`, "connects to the server directly"},
		},
		{
			name:    "insecure-skip-tls-verify beside certificate-authority-data",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a","certificate-authority-data":"QQ==","insecure-skip-tls-verify":true}}],"contexts":[{"name":"x","context":{"cluster":"c"}}],"current-context":"x"}`,
			wantErr: []string{`cluster "c": insecure-skip-tls-verify beside certificate-authority-data`, "as kubectl does", "remove one of them"},
		},
		{
			name:    "insecure-skip-tls-verify beside certificate-authority",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://a","certificate-authority":"/no/such/ca.crt","insecure-skip-tls-verify":true}}],"contexts":[{"name":"x","context":{"cluster":"c"}}],"current-context":"x"}`,
			wantErr: []string{`cluster "c": insecure-skip-tls-verify beside certificate-authority`, "as kubectl does"},
		},
		{
			name:    "bad base64",
			in:      `{"clusters":[{"name":"c","cluster":{"server":"https://k","certificate-authority-data":"***"}}],"contexts":[{"name":"x","context":{"cluster":"c"}}]}`,
			wantErr: []string{"certificate-authority: not base64"},
		},
		{name: "not a kubeconfig", in: "\t- : [", wantErr: []string{"not YAML or JSON"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKubeconfig([]byte(tc.in), dir)
			if tc.wantErr != nil {
				wanterr.Mentions(t, err, tc.wantErr...)
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

// TestRedactURLNeverQuotesAPassword: errors that name a server URL go through
// RedactURL, which must not show a password in any form a URL can take.
func TestRedactURLNeverQuotesAPassword(t *testing.T) {
	for _, s := range []string{"https://u:secret@h:6443", "ftp://u:secret@h", "u:secret@h", "http://h/secret?x=1", "%zz:secret@h"} {
		got := RedactURL(s)
		if s != "http://h/secret?x=1" && strings.Contains(got, "secret") {
			t.Errorf("RedactURL(%q) = %s: it shows the password", s, got)
		}
		if got == "" {
			t.Errorf("RedactURL(%q) is empty", s)
		}
	}
}
