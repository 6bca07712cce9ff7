package kube

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// kubeconfigFields is the part of a kubeconfig's tree that ParseKubeconfig reads:
// at each level, the keys it reads and what is under them ("" marks a value read
// whole, such as exec). Trees are compared through it, so that keys the plugin
// never reads (and resolves no differently) do not count.
var kubeconfigFields = map[string]any{
	"current-context": "",
	"clusters": map[string]any{"name": "", "cluster": map[string]any{
		"server": "", "certificate-authority": "", "certificate-authority-data": "",
		"insecure-skip-tls-verify": "", "tls-server-name": "", "proxy-url": "",
	}},
	"contexts": map[string]any{"name": "", "context": map[string]any{"cluster": "", "user": ""}},
	"users": map[string]any{"name": "", "user": map[string]any{
		"token": "", "tokenFile": "", "client-certificate": "", "client-certificate-data": "",
		"client-key": "", "client-key-data": "", "username": "", "password": "", "exec": "",
		"auth-provider": "", "as": "", "as-uid": "", "as-groups": "", "as-user-extra": "",
	}},
}

// readFields keeps of the tree v what fields names: the members of a mapping it
// names, in each item of a list. A collection read whole (exec, as-groups) is only
// refused when there and not empty: that is what is kept of it.
func readFields(v any, fields any) any {
	want, ok := fields.(map[string]any)
	if !ok {
		switch v := v.(type) {
		case map[string]any:
			return fmt.Sprintf("a mapping, empty: %t", len(v) == 0)
		case []any:
			return fmt.Sprintf("a sequence, empty: %t", len(v) == 0)
		}
		return v
	}
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, sub := range want {
			if e, ok := v[k]; ok && e != nil { // null reads as missing
				out[k] = readFields(e, sub)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = readFields(e, fields)
		}
		return out
	}
	return v
}

// sameYAMLKubeconfig fails when yamlToJSON and the YAML library (the one kubectl
// reads kubeconfigs with) both read doc, and read the fields the plugin uses
// otherwise: a silent misread of a server, a credential or a context. A null
// counts as a missing field, as for the decoder. One difference is documented
// and allowed: a plain scalar YAML 1.1 resolves to a number or a boolean other
// than true/false (0x1F, 1e3, yes, on) is a string to yamlToJSON; in a field that
// is a string, kubectl refuses it.
func sameYAMLKubeconfig(t *testing.T, doc []byte) {
	t.Helper()
	got, err := yamlToJSON(doc)
	if err != nil {
		return
	}
	want, err := yaml.YAMLToJSON(doc)
	if err != nil {
		// yamlToJSON is more lenient here and there ("key: a: b", "key: - a", a
		// continuation line after a comment); kubectl refuses such a file, so no
		// other reading of it is relied upon.
		return
	}
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("yamlToJSON's output is not JSON: %v: %s", err, got)
	}
	if _, ok := g.(map[string]any); !ok {
		return // no kubeconfig: ParseKubeconfig refuses it
	}
	if diff := cmp.Diff(readFields(w, kubeconfigFields), readFields(g, kubeconfigFields), cmp.FilterValues(resolvedByYAML11, cmp.Ignore())); diff != "" {
		t.Errorf("%q: (-YAML library +yamlToJSON):\n%s", doc, diff)
	}
}

func FuzzYAMLToJSONAgreesWithTheYAMLLibrary(f *testing.F) {
	for _, doc := range []string{
		kubectlStyle,
		"---\n# header\nclusters: [{name: c, cluster: {server: 'https://k:6443', insecure-skip-tls-verify: false}}]\ncontexts: []\nusers:\n  - name: u\n    user: {token: t}\n",
		"clusters:\n  - name: c\n    cluster:\n      server: https://k\n      certificate-authority: ca.crt\ncurrent-context: \"\"\n",
		"\"current-context\": \"a\\\"b\\\\c\"\n'kind': 'it''s'\nclusters:\n-\n  name: empty-item-line\n",
		"current-context:\nusers: ~\nclusters: null\ncontexts:\n",
		"current-context: a\n  b\nkind: Config\n",
		"\ufeffcurrent-context: x\nclusters:\n- name: c\n",
		"users:\n- name: u\n  user:\n    token: abc # a comment\n    exec: {command: aws, args: [a, 'b c']}\n",
		"contexts:\n- - name: x\n  - context: {cluster: c, user: u}\n",
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) { sameYAMLKubeconfig(t, doc) })
}

// resolvedByYAML11 says whether a and b are the documented difference: one a
// number or a boolean the YAML library resolved, the other the string yamlToJSON
// read (the booleans both read are true and false).
func resolvedByYAML11(a, b any) bool {
	resolved := func(lib, ours any) bool {
		s, ok := ours.(string)
		switch lib.(type) {
		case float64:
			return ok
		case bool:
			return ok && s != "true" && s != "false"
		}
		return false
	}
	return resolved(a, b) || resolved(b, a)
}
