package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/agent"
)

// maxArgStrlen is Linux's MAX_ARG_STRLEN on 4 KiB pages: execve refuses (E2BIG) an
// environment string "NAME=value" that is longer, terminating NUL included.
const maxArgStrlen = 32 * 4096

// schemaBound returns the bound kw (maxItems, maxLength, maxProperties) of the value at
// path in values.schema.json (property names; "*" is a map's values: its
// additionalProperties, or its one patternProperties entry), through a $ref to a
// definition.
func schemaBound(t *testing.T, kw string, path ...string) (int, bool) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var node map[string]any
	if err := json.Unmarshal(raw, &node); err != nil {
		t.Fatal(err)
	}
	definitions, _ := node["definitions"].(map[string]any)
	for _, p := range path {
		var next any
		if p == "*" {
			next = node["additionalProperties"]
			if pp, ok := node["patternProperties"].(map[string]any); ok && len(pp) == 1 {
				for _, v := range pp {
					next = v
				}
			}
		} else {
			props, _ := node["properties"].(map[string]any)
			next = props[p]
		}
		n, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("values.schema.json has no %s", strings.Join(path, "."))
		}
		// {"$ref": "#/definitions/NAME"}: the definition's keywords, the node's own first.
		if ref, ok := n["$ref"].(string); ok {
			def, _ := definitions[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
			merged := maps.Clone(def)
			if merged == nil {
				merged = map[string]any{}
			}
			maps.Copy(merged, n)
			n = merged
		}
		node = n
	}
	v, ok := node[kw].(float64)
	return int(v), ok
}

// bound is schemaBound, or fallback (a size the schema admits while it has no bound).
func bound(t *testing.T, fallback int, kw string, path ...string) int {
	t.Helper()
	if n, ok := schemaBound(t, kw, path...); ok {
		return n
	}
	t.Logf("values.schema.json has no %s for %s: trying %d", kw, strings.Join(path, "."), fallback)
	return fallback
}

// TestTheLargestValuesTheSchemaAdmitsStartTheAgent: the schema bounds what reaches the
// agent's environment, so that the largest values it admits still start the agent on
// every node: the agent's settings parser accepts them (its run directory leaves room for
// a unix socket's 107 bytes), and the kernel execs a process with that environment (one
// variable of more than 128 KiB, or all of them beyond the limit of the whole, is E2BIG:
// the container would never start). The plugin's entry (CNI_NETWORK_CONFIG) holds each
// excluded namespace twice.
func TestTheLargestValuesTheSchemaAdmitsStartTheAgent(t *testing.T) {
	name := func(prefix string, i int) string { return fmt.Sprintf("%s%0*d", prefix, 63-len(prefix), i) }
	var exclude, multus []string
	for i := range bound(t, 1000, "maxItems", "excludeNamespaces") {
		exclude = append(exclude, name("x", i))
	}
	for i := range bound(t, 3000, "maxItems", "multus", "namespaces") {
		multus = append(multus, name("m", i))
	}
	var uids []int
	for i := range bound(t, 64, "maxItems", "extraBypassUIDs") {
		uids = append(uids, 4294967294-i)
	}
	runDir := "/" + strings.Repeat("r", bound(t, 120, "maxLength", "cniAgentRunDir")-1)
	binDir := nodePath("b", bound(t, 200000, "maxLength", "cniBinDir"))
	confDir := nodePath("c", bound(t, 200000, "maxLength", "cniConfDir"))
	env := map[string]string{}
	for i := range bound(t, 8, "maxProperties", "env") {
		env[fmt.Sprintf("EXTRA_%02d", i)] = strings.Repeat("v", bound(t, 200000, "maxLength", "env", "*"))
	}
	values, err := json.Marshal(map[string]any{
		"excludeNamespaces": exclude, "extraBypassUIDs": uids, "cniAgentRunDir": runDir, "env": env,
		"cniBinDir": binDir, "cniConfDir": confDir,
		"multus": map[string]any{"namespaces": multus},
	})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "largest.json")
	if err := os.WriteFile(file, values, 0o644); err != nil {
		t.Fatal(err)
	}
	m := mustRender(t, "-f", profileFile("openshift"), "-f", file)
	podEnvironment := podEnv(t, m, "istio-cni-node-x7k2p", "worker-1")
	if _, err := agent.Parse(nil, func(k string) (string, bool) { v, ok := podEnvironment[k]; return v, ok }); err != nil {
		t.Errorf("the agent refuses the environment of the largest values: %v", err)
	}
	var environ []string
	for k, v := range podEnvironment {
		kv := k + "=" + v
		if len(kv)+1 > maxArgStrlen {
			t.Errorf("%s is %d bytes, over the kernel's %d for one environment string", k, len(kv)+1, maxArgStrlen)
		}
		environ = append(environ, kv)
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("no true(1) to exec: %v", err)
	}
	cmd := exec.Command(truePath)
	cmd.Env = environ
	if err := cmd.Run(); err != nil {
		t.Errorf("exec with the agent's environment of the largest values: %v", err)
	}
}

// nodePath is an absolute path of n characters whose names are of the longest a
// file's may be (255 bytes, NAME_MAX), each of c.
func nodePath(c string, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString("/" + strings.Repeat(c, min(255, n-b.Len()-1)))
	}
	return b.String()
}

// TestValuesBeyondTheBoundsAreRefusedNamingThem: one more than a bound fails the render
// with the schema's message naming the value.
func TestValuesBeyondTheBoundsAreRefusedNamingThem(t *testing.T) {
	list := func(n int, prefix string) string {
		var items []string
		for i := range n {
			items = append(items, fmt.Sprintf("%q", fmt.Sprintf("%s%d", prefix, i)))
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	maxExclude, _ := schemaBound(t, "maxItems", "excludeNamespaces")
	maxMultus, _ := schemaBound(t, "maxItems", "multus", "namespaces")
	maxRunDir, _ := schemaBound(t, "maxLength", "cniAgentRunDir")
	maxEnv, _ := schemaBound(t, "maxProperties", "env")
	maxEnvValue, _ := schemaBound(t, "maxLength", "env", "*")
	maxDir, _ := schemaBound(t, "maxLength", "cniBinDir")
	envMap := map[string]string{}
	for i := range maxEnv + 1 {
		envMap[fmt.Sprintf("E%d", i)] = "x"
	}
	tooMany, _ := json.Marshal(envMap)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"one excluded namespace too many", []string{"--set-json", "excludeNamespaces=" + list(maxExclude+1, "ns")}, []string{"/excludeNamespaces", "maxItems"}},
		{"one multus namespace too many", []string{"-f", profileFile("openshift"), "--set-json", "multus.namespaces=" + list(maxMultus+1, "ns")}, []string{"/multus/namespaces", "maxItems"}},
		{"run dir too long for its sockets", []string{"--set", "cniAgentRunDir=/" + strings.Repeat("r", maxRunDir)}, []string{"/cniAgentRunDir", "maxLength"}},
		{"one env variable too many", []string{"--set-json", "env=" + string(tooMany)}, []string{"/env", "maxProperties"}},
		{"bin dir too long", []string{"--set", "cniBinDir=" + nodePath("b", maxDir+1)}, []string{"/cniBinDir", "maxLength"}},
		{"conf dir too long", []string{"--set", "cniConfDir=" + nodePath("c", maxDir+1)}, []string{"/cniConfDir", "maxLength"}},
		{"netns dir too long", []string{"--set", "cniNetnsDir=" + nodePath("n", maxDir+1)}, []string{"/cniNetnsDir", "maxLength"}},
		{"a name in a dir longer than a file's may be", []string{"--set", "cniBinDir=/opt/" + strings.Repeat("b", 256)}, []string{"/cniBinDir", "does not match"}},
		{"env value too long", []string{"--set", "env.BIG=" + strings.Repeat("v", maxEnvValue+1)}, []string{"/env/BIG", "maxLength"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want) })
	}
}

// TestPullSecretsAnySecretNameAreTaken: a Secret's name is a DNS subdomain (dots allowed,
// up to 253 characters), and imagePullSecrets and Istio's global.imagePullSecrets take
// any such name to the pods and the ServiceAccount; a name no Secret can have is refused
// naming the value.
func TestPullSecretsAnySecretNameAreTaken(t *testing.T) {
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) // 253
	m := mustRender(t, "--set", "imagePullSecrets={registry.example.com-pull}", "--set", "global.imagePullSecrets={quay.io-creds,"+long+"}")
	want := []string{"registry.example.com-pull", "quay.io-creds", long}
	if got := secretNames(m.daemonSet(t).Spec.Template.Spec.ImagePullSecrets); !slices.Equal(got, want) {
		t.Errorf("pod imagePullSecrets %v, want %v", got, want)
	}
	if got := saPullSecrets(t, m); !slices.Equal(got.([]string), want) {
		t.Errorf("ServiceAccount imagePullSecrets %v, want %v", got, want)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"upper case", []string{"--set", "imagePullSecrets={RegCred}"}, []string{"/imagePullSecrets/0", "'RegCred'"}},
		{"254 characters", []string{"--set", "global.imagePullSecrets={" + long + "x}"}, []string{"/global/imagePullSecrets/0", "maxLength"}},
		{"an empty label", []string{"--set", "imagePullSecrets={registry..example}"}, []string{"/imagePullSecrets/0", "'registry..example'"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want) })
	}
}
