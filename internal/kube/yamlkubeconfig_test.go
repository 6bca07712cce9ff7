package kube

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// kubectlStyle is a kubeconfig as `kubectl config view --raw` and kubeadm write it.
const kubectlStyle = `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkekNDQVIyZ0F3SUJBZ0lCQURBS0JnZ3Foa2pPUFFRREFqQWpNU0V3SHdZRFZRUUREQmhyTTNNdApjMlZ5ZG1WeUxXTmhRREUzTURBd01EQXdNREF3SGhjTk1qUXdNVEF4TURBd01EQXdXaGNOTXpRd01UQXhNREF3Ck1EQXdXakFqTVNFd0h3WURWUVFEREJock0zTXRjMlZ5ZG1WeUxXTmhRREUzTURBd01EQXdNREF3V1RBVEJnY3EKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
    server: https://127.0.0.1:6443
  name: kind-kind
- cluster:
    insecure-skip-tls-verify: true
    server: "https://other.example:443"
  name: 'other'
contexts:
- context:
    cluster: kind-kind
    namespace: default # a comment after a value
    user: kind-kind
  name: kind-kind
current-context: kind-kind
kind: Config
preferences: {}
users:
- name: kind-kind
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
- name: token-user
  user:
    token: "abc#not-a-comment"
    tokenFile: /var/run/secrets/token
`

// TestYAMLToJSONReadsKubeconfigsAsTheYAMLLibraryDoes: each kubeconfig is read to the
// same tree as sigs.k8s.io/yaml reads it (the library the plugin used before).
func TestYAMLToJSONReadsKubeconfigsAsTheYAMLLibraryDoes(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	longCA := b64(strings.Repeat("-----BEGIN CERTIFICATE-----\nMIIB", 40))
	cases := map[string]string{
		"kubectl style":             kubectlStyle,
		"document start and flow":   "---\n# header\nclusters: [{name: c, cluster: {server: 'https://k:6443', insecure-skip-tls-verify: false}}]\ncontexts: []\nusers:\n  - name: u\n    user: {token: t}\n",
		"indented sequences":        "clusters:\n  - name: c\n    cluster:\n      server: https://k\n      certificate-authority: ca.crt\ncurrent-context: \"\"\n",
		"quoted keys and escapes":   "\"current-context\": \"a\\\"b\\\\c\"\n'kind': 'it''s'\nclusters:\n-\n  name: empty-item-line\n",
		"null and empty":            "current-context:\nusers: ~\nclusters: null\ncontexts:\n",
		"plain scalar on two lines": "current-context: a\n  b\nkind: Config\n",
		"JSON":                      `{"clusters":[{"name":"c","cluster":{"server":"https://k"}}],"current-context":"x"}`,
		"long inline CA":            "clusters:\n- name: c\n  cluster:\n    server: https://k\n    certificate-authority-data: " + longCA + "\n",
		"a byte order mark":         "\ufeffcurrent-context: x\nclusters:\n- name: c\n",
		"a byte order mark, JSON":   "\ufeff" + `{"current-context":"x"}`,
		// A quote inside a plain scalar is text: the comment after it is one.
		"a quote inside a plain scalar":             "users:\n- name: u\n  user:\n    token: abc \"def #not-part-of-the-token\"\n    tokenFile: '/f #g' # c\n",
		"a continuation line starting with a quote": "current-context: a\n  \"b #c\"\n",
		"a continuation line starting with a dash":  "current-context: a\n  - 'd #e'\n",
	}
	// The agent's own writer: sigs.k8s.io/yaml's Marshal of the same shape.
	agent, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": "istio-cni-context",
		"clusters": []any{map[string]any{"name": "local", "cluster": map[string]any{"server": "https://10.96.0.1:443",
			"certificate-authority-data": []byte(strings.Repeat("-----BEGIN CERTIFICATE-----\nMIIB\n", 30))}}},
		"users":    []any{map[string]any{"name": "istio-cni", "user": map[string]string{"token": "eyJhbGciOiJSUzI1NiIsImtpZCI6Ij" + strings.Repeat("x", 900)}}},
		"contexts": []any{map[string]any{"name": "istio-cni-context", "context": map[string]string{"cluster": "local", "user": "istio-cni"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases["the agent's writer"] = "# Kubeconfig of the istio-cni plugin\n" + string(agent)
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := yaml.YAMLToJSON([]byte(in))
			if err != nil {
				t.Fatalf("the YAML library refuses the case: %v", err)
			}
			got, err := yamlToJSON([]byte(in))
			if err != nil {
				t.Fatalf("yamlToJSON: %v", err)
			}
			var w, g any
			if err := json.Unmarshal(want, &w); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("yamlToJSON's output is not JSON: %v: %s", err, got)
			}
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("(-YAML library +yamlToJSON):\n%s", diff)
			}
		})
	}
}

// TestYAMLToJSONRefusesWhatItDoesNotRead: the YAML it does not implement is refused
// naming the line, never read as something else.
func TestYAMLToJSONRefusesWhatItDoesNotRead(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"anchor", "clusters:\n- &c\n  name: c\n", "line 2: YAML anchors and aliases"},
		{"alias", "a: x\nb: *x\n", "line 2: YAML anchors and aliases"},
		{"tag", "current-context: !!str x\n", "line 1: YAML tags"},
		{"block scalar", "users:\n- user:\n    token: |\n      abc\n", "line 3: YAML block scalars"},
		{"second document", "kind: Config\n---\nkind: Config\n", "line 2: more than one YAML document"},
		{"tab indentation", "clusters:\n\t- name: c\n", "line 2: tab in indentation"},
		{"multi-line quoted", "current-context: \"a\n  b\"\n", "line 2: a quoted scalar or flow collection continued"},
		{"multi-line flow", "clusters: [a,\n  b]\n", "line 2: a quoted scalar or flow collection continued"},
		{"repeated key", "kind: a\nkind: b\n", `line 2: key "kind" repeated`},
		{"repeated key in a flow mapping", "users:\n- name: u\n  user: {token: t, token:}\n", `line 3: key "token" repeated`},
		{"bad indentation", "clusters:\n  - name: c\n - name: d\n", "line 3: unexpected indentation"},
		{"unterminated quote", "current-context: \"abc\n", "line 1: unterminated double-quoted"},
		{"flow not closed on its line", "clusters: [a, b\n", "line 1: flow collection"},
		{"not JSON", `{"clusters": [`, "not valid JSON"},
		{"UTF-16", "\xff\xfec\x00u\x00r\x00r\x00e\x00n\x00t\x00-\x00c\x00o\x00n\x00t\x00e\x00x\x00t\x00:\x00 \x00x\x00\n\x00", "line 1: not UTF-8"},
		{"not UTF-8", "users:\n- user:\n    token: abc\xff\n", "line 3: not UTF-8"},
		{"not UTF-8, JSON", "{\n\"users\":[{\"user\":{\"token\":\"abc\xff\"}}]}", "line 2: not UTF-8"},
		{"junk after a value", "current-context: 'a' b\n", "line 1: unexpected"},
		{"merge key", "users:\n- name: u\n  user:\n    <<: {token: t}\n", "line 4: YAML merge keys"},
		{"merge key in a flow mapping", "users:\n- name: u\n  user: {<<: {token: t}}\n", "line 3: YAML merge keys"},
		{"content on the document start line", "--- {}\ncurrent-context: x\n", "line 1: content after ---"},
		{"tab after a key in a flow mapping", "users:\n- name: u\n  user: {token:\tabc}\n", "line 3: tab in a line"},
		{"tab after a key", "users:\n- name: u\n  user:\n    token:\tabc\n", "line 4: tab in a line"},
		{"a lone carriage return", "users:\n- user:\n    token: abc\rtokenFile: /f\n", "line 3: a line break other than LF or CRLF"},
		{"a line separator", "current-context: a\u2028kind: Config\r\n", "line 1: a line break other than LF or CRLF"},
		{"a next line in JSON", "{\n\"users\": [{\"user\": {\"token\": \"abc\u0085def\"}}]}", "line 2: a line break other than LF or CRLF"},
		{"Go's octal escape", "current-context: \"a\\012\"\n", "line 1: double-quoted scalar with an escape YAML reads otherwise"},
		{"a \\x escape over 0x7f", "current-context: \"caf\\xe9\"\n", "line 1: double-quoted scalar with an escape YAML reads otherwise"},
		{"empty line in a plain scalar", "users:\n- user:\n    token: abc\n\n      def\n", "line 5: a plain scalar continued after an empty"},
		{"comment line in a plain scalar", "current-context: a\n# c\n  b\n", "line 3: a plain scalar continued after an empty or comment"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := yamlToJSON([]byte(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestKubeconfigSyntaxErrorsQuoteNoValue: an error about a malformed line names the
// line but never quotes what is on it. The plugin's errors reach the pod's events
// (FailedCreatePodSandBox, readable by whoever can read the pod's namespace) and
// the node's NetworkReady condition, and the line may hold the token or the
// client key.
func TestKubeconfigSyntaxErrorsQuoteNoValue(t *testing.T) {
	const secret = "eyJhbGciOiJSUzI1NiJ9SECRET"
	kubeconfig := func(userLine string) string {
		return "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: https://k:6443\n" +
			"users:\n- name: u\n  user:\n    " + userLine + "\n" +
			"contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	}
	cases := []struct{ name, userLine, wantLine string }{
		{"an escape a double-quoted token cannot have", `token: "` + secret + `\q"`, "line 9:"},
		{"text after a double-quoted token", `token: "x"` + secret, "line 9:"},
		{"text after a single-quoted token", `token: 'x'` + secret, "line 9:"},
		{"text after a quoted key in a flow mapping", `{token: "x"` + secret + `}`, "line 9:"},
		{"an escape a double-quoted client key cannot have", `client-key-data: "` + secret + `\q"`, "line 9:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseKubeconfig([]byte(kubeconfig(c.userLine)), "/")
			if err == nil {
				t.Fatal("parsed; want an error")
			}
			if !strings.Contains(err.Error(), c.wantLine) {
				t.Errorf("error %q does not name %q", err, c.wantLine)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error quotes the line's value: %q", err)
			}
		})
	}
}
