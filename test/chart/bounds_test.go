package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/agent"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// maxArgStrlen is Linux's MAX_ARG_STRLEN on 4 KiB pages: execve refuses (E2BIG) an
// environment string "NAME=value" that is longer, terminating NUL included.
const maxArgStrlen = 32 * 4096

// affinityBound is the chart's bound of affinity, as JSON (istio-cni.affinity).
const affinityBound = 16384

// schemaBound returns the bound kw (maxItems, maxLength, maxProperties) of the value at
// path in values.schema.json (property names; "*" is a map's values: its
// additionalProperties, or its one patternProperties entry that is not false), through
// a $ref to a definition.
func schemaBound(t *testing.T, kw string, path ...string) (int, bool) {
	t.Helper()
	node := readSchema(t)
	definitions, _ := node["definitions"].(map[string]any)
	for _, p := range path {
		var next any
		if p == "*" {
			next = node["additionalProperties"]
			// The one patternProperties entry that is a schema of its own (a false
			// one only refuses the keys it matches).
			var schemas []any
			if pp, ok := node["patternProperties"].(map[string]any); ok {
				for _, v := range pp {
					if _, isSchema := v.(map[string]any); isSchema {
						schemas = append(schemas, v)
					}
				}
			}
			if len(schemas) == 1 {
				next = schemas[0]
			}
		} else {
			props, _ := node["properties"].(map[string]any)
			next = props[p]
		}
		n, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("values.schema.json has no %s", strings.Join(path, "."))
		}
		n = withDefinition(n, definitions)
		node = n
	}
	v, ok := node[kw].(float64)
	return int(v), ok
}

// readSchema is values.schema.json, decoded.
func readSchema(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// withDefinition is node with the keywords of the definition its $ref names
// ("#/definitions/NAME"), the node's own first; node itself when it has none.
func withDefinition(node, definitions map[string]any) map[string]any {
	ref, ok := node["$ref"].(string)
	if !ok || !strings.HasPrefix(ref, "#/definitions/") {
		return node
	}
	def, _ := definitions[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
	merged := maps.Clone(def)
	if merged == nil {
		merged = map[string]any{}
	}
	maps.Copy(merged, node)
	delete(merged, "$ref")
	return merged
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

// largestValues writes a values file of the largest values the schema admits (each
// list at its maxItems, each text at its maxLength, each map at its maxProperties),
// of every value that reaches the agent or its DaemonSet, and returns its path.
func largestValues(t *testing.T) string {
	t.Helper()
	name := func(prefix string, i int) string { return fmt.Sprintf("%s%0*d", prefix, 63-len(prefix), i) }
	// key is a label key of the longest form: a prefix of 253 characters and a name
	// of 63 (the schema's bound of the whole, 317).
	key := func(prefix string, i int) string {
		n := bound(t, 400, "maxLength", "taint", "key")
		dns := strings.Repeat(strings.Repeat("p", 63)+".", 3) + strings.Repeat("p", 61) // 253
		return dns[:n-64] + "/" + name(prefix, i)
	}
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
	// The image: hub at its bound and the rest of the 255 characters of a repository
	// name in image (the chart refuses a longer one), the longest tag.
	hubLen := bound(t, 1000, "maxLength", "hub")
	hub := "registry.example.com/" + strings.Repeat("h", hubLen-len("registry.example.com/"))
	image := strings.Repeat("i", max(1, 255-hubLen-1))
	tag := strings.Repeat("t", bound(t, 1000, "maxLength", "tag"))
	var secrets, globalSecrets []string
	for i := range bound(t, 200, "maxItems", "imagePullSecrets") {
		secrets = append(secrets, pullSecretName("a", i))
	}
	for i := range bound(t, 200, "maxItems", "global", "imagePullSecrets") {
		globalSecrets = append(globalSecrets, pullSecretName("g", i))
	}
	var tolerations []map[string]any
	for i := range bound(t, 200, "maxItems", "tolerations") {
		tolerations = append(tolerations, map[string]any{"key": key("t", i), "operator": "Equal", "value": name("v", i),
			"effect": "NoExecute", "tolerationSeconds": 9007199254740991})
	}
	// nodeSelector keeps values.yaml's kubernetes.io/os: helm merges maps, so it
	// has room for one fewer.
	labels := func(prefix string, fewer int) map[string]string {
		m := map[string]string{}
		for i := range bound(t, 200, "maxProperties", "podLabels") - fewer {
			m[key(prefix, i)] = name("v", i)
		}
		return m
	}
	annotations := map[string]string{}
	for i := range bound(t, 200, "maxProperties", "podAnnotations") {
		annotations[key("a", i)] = strings.Repeat("a", bound(t, 10000, "maxLength", "podAnnotations", "*"))
	}
	se := strings.Repeat("s", bound(t, 5000, "maxLength", "seLinuxOptions", "user"))
	profile := bound(t, 5000, "maxLength", "appArmorProfile", "localhostProfile")
	var affinity map[string]any
	if err := json.Unmarshal([]byte(affinityNear(affinityBound)), &affinity); err != nil {
		t.Fatal(err)
	}
	values, err := json.Marshal(map[string]any{
		"affinity":          affinity,
		"excludeNamespaces": exclude, "extraBypassUIDs": uids, "cniAgentRunDir": runDir, "env": env,
		"cniBinDir": binDir, "cniConfDir": confDir,
		"multus": map[string]any{"namespaces": multus},
		"hub":    hub, "image": image, "tag": tag,
		"imagePullSecrets": secrets, "global": map[string]any{"imagePullSecrets": globalSecrets},
		"tolerations": tolerations,
		"podLabels":   labels("p", 0), "daemonSetLabels": labels("d", 0), "nodeSelector": labels("n", 1),
		"podAnnotations":    annotations,
		"priorityClassName": strings.Repeat("c", bound(t, 1000, "maxLength", "priorityClassName")),
		"seLinuxOptions":    map[string]string{"user": se, "role": se, "type": se, "level": se},
		"seccompProfile":    map[string]string{"type": "Localhost", "localhostProfile": nodePath("p", profile+1)[1:]},
		"appArmorProfile":   map[string]string{"type": "Localhost", "localhostProfile": strings.Repeat("a", profile)},
	})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "largest.json")
	if err := os.WriteFile(file, values, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// affinityNear is the largest node affinity of at most size bytes as JSON (compact,
// as the chart measures it with toJson): one preferred term whose values are label
// values of 63 characters, 66 bytes each with their quotes and comma.
func affinityNear(size int) string {
	head := `{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"preference":{"matchExpressions":[{"key":"k","operator":"In","values":[`
	tail := `]}]},"weight":1}]}}`
	var values []string
	for n := 0; len(head)+len(tail)+66*(n+1)-1 <= size; n++ {
		values = append(values, fmt.Sprintf("%q", fmt.Sprintf("v%062d", n)))
	}
	return head + strings.Join(values, ",") + tail
}

// pullSecretName is a Secret name of the longest form (253 characters).
func pullSecretName(prefix string, i int) string {
	n := fmt.Sprintf("%s-%d", prefix, i)
	return strings.Repeat("s", 253-len(n)) + n
}

// TestTheLargestValuesTheSchemaAdmitsStartTheAgent: the schema bounds what reaches the
// agent's environment and its DaemonSet, so that the largest values it admits still
// start the agent on every node: the agent's settings parser accepts them (its run
// directory leaves room for a unix socket's 107 bytes), the kernel execs a process with
// that environment (one variable of more than 128 KiB, or all of them beyond the limit
// of the whole, is E2BIG: the container would never start), every object validates
// against the schemas of every supported Kubernetes release, the image reference is one
// container runtimes take (a repository name of at most 255 characters, a tag of at
// most 128: distribution/reference's limits, which containerd and CRI-O parse with),
// and the SELinux context the runtime makes of seLinuxOptions fits the kernel's page
// for /proc/self/attr/exec. The plugin's entry (CNI_NETWORK_CONFIG) holds each excluded
// namespace twice. TestTheLargestValuesTheSchemaAdmitsAreTakenByTheAPIServer creates
// the objects.
func TestTheLargestValuesTheSchemaAdmitsStartTheAgent(t *testing.T) {
	m := mustRender(t, "-f", profileFile("openshift"), "-f", largestValues(t))
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

	c := m.agent(t)
	repository, tag, _ := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
	repository = c.Image[:strings.LastIndex(c.Image, "/")+1] + repository
	if len(repository) > 255 || len(tag) > 128 || tag == "" {
		t.Errorf("image %s: a repository name of %d characters and a tag of %d, want at most 255 and 1 to 128 (distribution/reference)", c.Image, len(repository), len(tag))
	}
	if se := c.SecurityContext.SELinuxOptions; se == nil {
		t.Error("no seLinuxOptions rendered")
	} else if n := len(se.User + ":" + se.Role + ":" + se.Type + ":" + se.Level); n+1 > 4096 {
		t.Errorf("the SELinux context of seLinuxOptions is %d bytes, more than the kernel's page (4096) for /proc/self/attr/exec", n+1)
	}

	file := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(file, m.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	validate := tool(t, "kubectl-validate")
	for _, rs := range releaseSchemas(t) {
		if err := kubectlValidate(validate, file, rs, m); err != nil {
			t.Error(err)
		}
	}
}

// TestTheLargestValuesTheSchemaAdmitsAreTakenByTheAPIServer: a real API server
// creates the DaemonSet, the ConfigMaps and the ServiceAccount of the largest values
// the schema admits: their labels, annotations (256 KiB in all), tolerations, image
// and whole size (etcd's 1.5 MiB of a request) are within what it takes.
func TestTheLargestValuesTheSchemaAdmitsAreTakenByTheAPIServer(t *testing.T) {
	m := mustRender(t, "-f", profileFile("openshift"), "-f", largestValues(t))
	cp := controlplane.StartForTestWithNamespaces(t, controlplane.Options{}, namespace)
	client := cp.AdminClient()
	ctx := t.Context()
	created := 0
	for _, d := range m.docs {
		var err error
		switch o := d.object.(type) {
		case *appsv1.DaemonSet:
			_, err = client.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = client.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			continue
		}
		if err != nil {
			t.Errorf("create %s (%d bytes): %v", d, len(d.raw), err)
		}
		created++
	}
	if created < 3 {
		t.Errorf("created %d objects, want the DaemonSet, the ConfigMaps and the ServiceAccount", created)
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
	maxHub, _ := schemaBound(t, "maxLength", "hub")
	maxImage, _ := schemaBound(t, "maxLength", "image")
	maxTag, _ := schemaBound(t, "maxLength", "tag")
	maxSecrets, _ := schemaBound(t, "maxItems", "imagePullSecrets")
	maxTolerations, _ := schemaBound(t, "maxItems", "tolerations")
	maxSELinux, _ := schemaBound(t, "maxLength", "seLinuxOptions", "level")
	maxAnnotations, _ := schemaBound(t, "maxProperties", "podAnnotations")
	maxAnnotation, _ := schemaBound(t, "maxLength", "podAnnotations", "*")
	maxLabels, _ := schemaBound(t, "maxProperties", "podLabels")
	stringMap := func(n int, prefix string) string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("%s%d", prefix, i)] = "v"
		}
		data, _ := json.Marshal(m)
		return string(data)
	}
	tolerations := func(n int) string {
		var items []string
		for i := range n {
			items = append(items, fmt.Sprintf(`{"key":"k%d","operator":"Exists"}`, i))
		}
		return "[" + strings.Join(items, ",") + "]"
	}
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
		{"env name too long", []string{"--set", "env.N" + strings.Repeat("n", 256) + "=1"}, []string{"/env", "additional properties", "'N" + strings.Repeat("n", 256) + "'"}},
		{"hub too long", []string{"--set", "hub=" + strings.Repeat("h", maxHub+1)}, []string{"/hub", "maxLength"}},
		{"hub and image past a repository name's 255", []string{"--set", "hub=" + strings.Repeat("h", maxHub), "--set", "image=ii"},
			[]string{`hub "` + strings.Repeat("h", maxHub) + `" and image "ii"`, "256 characters, more than the 255"}},
		{"image too long", []string{"--set", "image=" + strings.Repeat("i", maxImage+1)}, []string{"/image", "maxLength"}},
		{"tag too long", []string{"--set", "tag=" + strings.Repeat("t", maxTag+1)}, []string{"/tag", "maxLength"}},
		{"Istio's global.hub too long", []string{"--set", "global.hub=" + strings.Repeat("h", maxHub+1)}, []string{"/global/hub", "maxLength"}},
		{"one pull secret too many", []string{"--set-json", "imagePullSecrets=" + list(maxSecrets+1, "s")}, []string{"/imagePullSecrets", "maxItems"}},
		{"one toleration too many", []string{"--set-json", "tolerations=" + tolerations(maxTolerations+1)}, []string{"/tolerations", "maxItems"}},
		{"a toleration key's prefix too long", []string{"--set-json", `tolerations=[{"key":"` + strings.Repeat("p", 254) + `/k","operator":"Exists"}]`}, []string{"/tolerations/0/key", strings.Repeat("p", 254) + "/k"}},
		{"a toleration's seconds past helm's exact integers", []string{"--set-json", `tolerations=[{"operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740992}]`}, []string{"/tolerations/0/tolerationSeconds", "maximum"}},
		{"seLinuxOptions level too long", []string{"--set", "seLinuxOptions.level=" + strings.Repeat("s", maxSELinux+1)}, []string{"/seLinuxOptions/level", "maxLength"}},
		{"seLinuxOptions user too long", []string{"--set", "seLinuxOptions.user=" + strings.Repeat("u", maxSELinux+1)}, []string{"/seLinuxOptions/user", "maxLength"}},
		{"one pod annotation too many", []string{"--set-json", "podAnnotations=" + stringMap(maxAnnotations+1, "a")}, []string{"/podAnnotations", "maxProperties"}},
		{"a pod annotation too long", []string{"--set", "podAnnotations.note=" + strings.Repeat("a", maxAnnotation+1)}, []string{"/podAnnotations/note", "maxLength"}},
		{"one pod label too many", []string{"--set-json", "podLabels=" + stringMap(maxLabels+1, "l")}, []string{"/podLabels", "maxProperties"}},
		{"a label key's prefix too long", []string{"--set-json", `podLabels={"` + strings.Repeat("p", 254) + `/k":"v"}`}, []string{"/podLabels/" + strings.Repeat("p", 254) + "~1k", "false schema"}},
		{"a taint key's prefix too long", []string{"--set", "taint.key=" + strings.Repeat("p", 254) + "/k"}, []string{"/taint/key", strings.Repeat("p", 254) + "/k"}},
		{"a taint duration too long to write", []string{"--set", "taint.retryPeriod=" + strings.Repeat("1", 64) + "s"}, []string{"/taint/retryPeriod", "maxLength"}},
		{"a taint duration past Go's longest", []string{"--set", "taint.enabled=true", "--set", "taint.leaseDuration=2562048h"},
			[]string{"taint.leaseDuration 2562048h", "longer than 2562047h47m16.854s"}},
		{"a scrape interval past Prometheus' longest", []string{"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.interval=9999999h"},
			[]string{"monitoring.podMonitor.interval 9999999h", "longer than 2562047h47m16.854s"}},
		{"affinity too large", []string{"--set-json", "affinity=" + affinityNear(affinityBound+100)}, []string{"affinity is", fmt.Sprintf("bytes as JSON, more than the %d", affinityBound)}},
		{"priority class name too long", []string{"--set", "priorityClassName=" + strings.Repeat("c", 254)}, []string{"/priorityClassName", "maxLength"}},
		{"CNI config file name too long", []string{"--set", "cniConfFileName=" + strings.Repeat("c", 251) + ".conf"}, []string{"/cniConfFileName", "maxLength"}},
		{"a seccomp profile's name longer than a file's", []string{"--set", "seccompProfile.type=Localhost", "--set", "seccompProfile.localhostProfile=" + strings.Repeat("p", 256)},
			[]string{"/seccompProfile/localhostProfile", "does not match"}},
		{"an AppArmor profile too long", []string{"--set", "appArmorProfile.type=Localhost", "--set", "appArmorProfile.localhostProfile=" + strings.Repeat("p", 1001)},
			[]string{"/appArmorProfile/localhostProfile", "maxLength"}},
		{"a resource name too long", []string{"--set", "resources.limits." + strings.Repeat("r", 318) + "=1"}, []string{"/resources/limits/" + strings.Repeat("r", 318), "false schema"}},
		{"a quantity too long", []string{"--set", "resources.limits.cpu=" + strings.Repeat("1", 65)}, []string{"/resources/limits/cpu"}},
		{"maxUnavailable over 100%", []string{"--set", "updateStrategy.rollingUpdate.maxUnavailable=101%"}, []string{"/updateStrategy/rollingUpdate/maxUnavailable", "101%"}},
		{"Istio's logging level too long", []string{"--set-json", `logging.level="` + strings.Repeat("a:debug,", 128) + `info"`}, []string{"/logging/level", "maxLength"}},
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

// unboundedOnPurpose are the values of the schema with no bound of their own, and why.
var unboundedOnPurpose = map[string]string{
	"affinity.nodeAffinity":         "the chart bounds affinity as a whole at render (affinityBound)",
	"affinity.podAffinity":          "the chart bounds affinity as a whole at render (affinityBound)",
	"affinity.podAntiAffinity":      "the chart bounds affinity as a whole at render (affinityBound)",
	"_internal_defaults_do_not_set": "refused at render whatever it holds",
	"defaults":                      "refused at render whatever it holds",
	"pilot":                         "Istio's istiod settings in a shared values file: never read here",
}

// unboundedRepetition finds what lets a pattern match text of any length: *, + or
// an open {n,} repetition.
var unboundedRepetition = regexp.MustCompile(`[*+]|\{[0-9]+,\}`)

// TestEveryTextListAndMapOfTheSchemaIsBounded: every text of values.schema.json has a
// maxLength, an enum or a const, or a pattern that bounds its length; every list a
// maxItems; every map (an object without properties of its own) a maxProperties;
// except unboundedOnPurpose. A value from outside with no bound could make a render
// that no API server, runtime or kernel takes.
func TestEveryTextListAndMapOfTheSchemaIsBounded(t *testing.T) {
	root := readSchema(t)
	definitions, _ := root["definitions"].(map[string]any)
	seen := map[string]bool{}
	var walk func(node map[string]any, path string)
	walk = func(node map[string]any, path string) {
		if node["$ref"] == "#" {
			return // Istio's nested cni: the top level again
		}
		node = withDefinition(node, definitions)
		seen[path] = true
		types := map[string]bool{}
		switch ty := node["type"].(type) {
		case string:
			types[ty] = true
		case []any:
			for _, x := range ty {
				types[x.(string)] = true
			}
		}
		_, hasEnum := node["enum"]
		_, hasConst := node["const"]
		_, hasMaxLength := node["maxLength"]
		pattern, hasPattern := node["pattern"].(string)
		_, hasMaxItems := node["maxItems"]
		_, hasMaxProperties := node["maxProperties"]
		_, hasProperties := node["properties"]
		why, onPurpose := unboundedOnPurpose[path]
		switch {
		case onPurpose:
			t.Logf("%s: no bound (%s)", path, why)
		case types["string"] && !hasEnum && !hasConst && !hasMaxLength && !(hasPattern && !unboundedRepetition.MatchString(pattern)):
			t.Errorf("%s: a text without maxLength, enum, const or a pattern that bounds it", path)
		case types["array"] && !hasMaxItems:
			t.Errorf("%s: a list without maxItems", path)
		case types["object"] && !hasProperties && !hasMaxProperties:
			t.Errorf("%s: a map without maxProperties", path)
		}
		child := func(v any, p string) {
			if n, ok := v.(map[string]any); ok {
				walk(n, p)
			}
		}
		if props, ok := node["properties"].(map[string]any); ok {
			for k, v := range props {
				child(v, strings.TrimPrefix(path+"."+k, "."))
			}
		}
		if pp, ok := node["patternProperties"].(map[string]any); ok {
			for _, v := range pp {
				child(v, path+".*")
			}
		}
		child(node["additionalProperties"], path+".*")
		child(node["items"], path+"[]")
		for _, kw := range []string{"allOf", "anyOf", "oneOf"} {
			list, _ := node[kw].([]any)
			for _, v := range list {
				child(v, path)
			}
		}
	}
	walk(root, "")
	for p := range unboundedOnPurpose {
		if !seen[p] {
			t.Errorf("unboundedOnPurpose names %s, which the schema does not have", p)
		}
	}
}
