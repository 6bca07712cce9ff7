package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// seedArgs is the seed documents' install command after `helm template`, with helm v2's
// `--name=istio-cni` and the chart path left out: helm v3 has no --name flag and takes the
// release name as its first argument instead (TestSeedCommandRendersWithHelmV3).
var seedArgs = []string{
	"--namespace=kube-system",
	"--set", "excludeNamespaces={}",
	"--set", "hub=docker.io/example",
	"--set", "tag=mytag",
	"--set", "pullPolicy=IfNotPresent",
	"--set", "logLevel=debug",
}

// variants are the renders whose every object is validated offline: the
// profiles, the seed command, and the switches that add or remove objects and fields.
var variants = []struct {
	name string
	args []string
}{
	{"profile default", []string{"-f", profileFile("default")}},
	{"profile gke", []string{"-f", profileFile("gke")}},
	{"profile openshift", []string{"-f", profileFile("openshift")}},
	{"profile k3d", []string{"-f", profileFile("k3d")}},
	{"profile k3s", []string{"-f", profileFile("k3s")}},
	{"profile microk8s", []string{"-f", profileFile("microk8s")}},
	{"profile minikube with troubleshooting", []string{"-f", profileFile("minikube"), "--set", "troubleshooting.enabled=true"}},
	{"platform gke in istio-system", []string{"--set", "global.platform=gke", "--namespace", "istio-system"}},
	{"seed command", seedArgs},
	{"all features", []string{"-f", "testdata/values/all-features.yaml"}},
	{"repair off", []string{"--set", "repair.enabled=false"}},
	{"repair labels", []string{"--set", "repair.deletePods=false"}},
	{"probes on the monitoring port", []string{"--set", "probes.port=15014", "--set", "probes.bindAddress="}},
	{"prometheus operator and dashboard", []string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
		"--set", "monitoring.serviceMonitor.interval=30s", "--set", "monitoring.podMonitor.scrapeTimeout=10s",
		"--set", "monitoring.serviceMonitor.labels.release=prom", "--set", "dashboard.enabled=true", "--set", "monitoringBindAddress=hostIP"}},
	{"openshift in several namespaces", []string{"-f", profileFile("openshift"), "--set", "multus.namespaces={default,bookinfo}"}},
	{"istio default values", []string{"-f", istioFile("default")}},
	{"istio nested cni values", istioArgs("nested-cni")},
	{"istio private registry", []string{"-f", istioFile("private-registry")}},
	{"istio openshift", []string{"-f", istioFile("openshift")}},
	{"istio gke", istioArgs("gke")},
	{"istio resources and seccomp", []string{"-f", istioFile("resources-seccomp")}},
	{"istio repair", []string{"-f", istioFile("repair")}},
	{"hardened: apparmor field", []string{"--set", "appArmorProfile.type=RuntimeDefault"}},
	{"hardened: apparmor annotation", []string{"--set", "appArmorProfile.type=Localhost", "--set", "appArmorProfile.localhostProfile=istio-cni", "--set", "useAppArmorAnnotation=true"}},
}

// TestLintStrictPassesForEveryProfile: helm lint --strict (warnings are failures) on the
// chart with each platform profile and each of Istio's values files (testdata/istio).
func TestLintStrictPassesForEveryProfile(t *testing.T) {
	files := map[string]string{}
	for _, p := range profiles {
		files[p] = profileFile(p)
	}
	for _, f := range istioFiles {
		files["istio "+f] = istioFile(f)
	}
	for name, file := range files {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", chartDir, "-f", file}, withHub...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestProfilesMatchGoldenRenders: the full render of each profile is the reviewed one in
// testdata/golden (go test -update rewrites them).
func TestProfilesMatchGoldenRenders(t *testing.T) {
	for _, p := range profiles {
		t.Run(p, func(t *testing.T) {
			m := mustRender(t, "-f", profileFile(p))
			golden.Check(t, filepath.Join("testdata", "golden", p+".yaml"), m.raw)
		})
	}
}

// TestEveryObjectValidatesOffline: every object of every variant passes kubectl-validate
// against the OpenAPI schemas of every supported Kubernetes release
// (hack/kube/SUPPORTED; each release's api/openapi-spec/v3, hack/tools/k8s-schemas.sh),
// uses only API versions that release serves (the NetworkAttachmentDefinition is
// checked against its CRD in test/crds), decodes strictly into client-go's types
// (unknown fields fail), and holds no combination the API server refuses beyond the
// schema.
func TestEveryObjectValidatesOffline(t *testing.T) {
	validate := tool(t, "kubectl-validate")
	schemas := releaseSchemas(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			m := mustRender(t, v.args...) // decodes every known kind strictly
			if len(m.docs) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, d := range m.docs {
				switch {
				case d.object != nil:
				case d.kind == "ServiceMonitor" || d.kind == "PodMonitor":
					// Checked by kubectl-validate against the CRD in test/crds.
				case d.kind == "NetworkAttachmentDefinition":
					if err := checkNetworkAttachmentDefinition(d.raw); err != nil {
						t.Errorf("%s: %v", d, err)
					}
				default:
					t.Errorf("%s is neither in client-go's scheme nor a kind this test knows", d)
				}
			}
			file := filepath.Join(t.TempDir(), "manifest.yaml")
			if err := os.WriteFile(file, m.raw, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, rs := range schemas {
				if err := kubectlValidate(validate, file, rs, m); err != nil {
					t.Error(err)
				}
				for _, d := range m.docs {
					if !crdKinds[d.kind] && !rs.serves(d.apiVersion) {
						t.Errorf("%s: Kubernetes %s does not serve %s", d, rs.version, d.apiVersion)
					}
				}
			}
			checkSecurityContextRules(t, m)
		})
	}
}

// crdKinds are the kinds the chart renders that come from a CRD (test/crds), not
// from a Kubernetes release.
var crdKinds = map[string]bool{"NetworkAttachmentDefinition": true, "ServiceMonitor": true, "PodMonitor": true}

// releaseSchema is one Kubernetes release's OpenAPI schemas in kubectl-validate's
// --local-schemas layout.
type releaseSchema struct{ version, dir string }

// serves says whether the release has the API version (its schema file exists).
func (r releaseSchema) serves(apiVersion string) bool {
	path := "api/v1.json"
	if group, version, ok := strings.Cut(apiVersion, "/"); ok {
		path = filepath.Join("apis", group, version+".json")
	} else if apiVersion != "v1" {
		return false
	}
	_, err := os.Stat(filepath.Join(r.dir, path))
	return err == nil
}

func releaseSchemas(t *testing.T) []releaseSchema {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "hack", "kube", "SUPPORTED"))
	if err != nil {
		t.Fatal(err)
	}
	var out []releaseSchema
	for _, v := range strings.Fields(string(data)) {
		cmd := exec.Command(filepath.Join(repoRoot, "hack", "tools", "k8s-schemas.sh"), v)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		dir, err := cmd.Output()
		if err != nil {
			t.Fatalf("hack/tools/k8s-schemas.sh %s: %v\n%s", v, err, stderr.String())
		}
		out = append(out, releaseSchema{version: v, dir: strings.TrimSpace(string(dir))})
	}
	if len(out) == 0 {
		t.Fatal("hack/kube/SUPPORTED lists no release")
	}
	return out
}

// kubectlValidate runs kubectl-validate on file against one release's schemas and
// reports each failing document by kind and name. kubectl-validate v0.0.4 embeds
// schemas up to 1.30 only and would fetch newer ones from GitHub: it is given 1.30
// as its version and the release's own schemas, which it reads before its embedded
// ones (every group-version the chart uses is in them, which the caller checks).
func kubectlValidate(bin, file string, rs releaseSchema, m *manifest) error {
	cmd := exec.Command(bin, file, "--version", "1.30", "--local-schemas", rs.dir, "--local-crds", "../crds", "--output", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var results map[string][]struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		return fmt.Errorf("kubectl-validate: %v, output not JSON: %v\n%s%s", runErr, err, stdout.String(), stderr.String())
	}
	statuses := results[file]
	if len(statuses) != len(m.docs) {
		return fmt.Errorf("kubectl-validate reported %d documents, the render has %d:\n%s", len(statuses), len(m.docs), stdout.String())
	}
	var failures []string
	for i, s := range statuses {
		if s.Status != "Success" {
			failures = append(failures, fmt.Sprintf("%s: %s %s", m.docs[i], s.Status, s.Message))
		}
	}
	if len(failures) > 0 {
		return fmt.Errorf("kubectl-validate (Kubernetes %s):\n  %s", rs.version, strings.Join(failures, "\n  "))
	}
	if runErr != nil {
		return fmt.Errorf("kubectl-validate failed although every document passed: %v\n%s", runErr, stderr.String())
	}
	return nil
}

// checkNetworkAttachmentDefinition checks what Multus needs of the object, which is not in
// client-go's scheme: group k8s.cni.cncf.io/v1, a name and namespace, only known fields,
// and a spec.config that, when present, is a JSON CNI config.
func checkNetworkAttachmentDefinition(raw []byte) error {
	var nad struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string            `json:"name"`
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec *struct {
			Config *string `json:"config"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &nad); err != nil {
		return fmt.Errorf("unexpected structure: %w", err)
	}
	if nad.APIVersion != "k8s.cni.cncf.io/v1" {
		return fmt.Errorf("apiVersion %q, want k8s.cni.cncf.io/v1", nad.APIVersion)
	}
	if nad.Metadata.Name == "" || nad.Metadata.Namespace == "" {
		return fmt.Errorf("name %q and namespace %q must both be set", nad.Metadata.Name, nad.Metadata.Namespace)
	}
	if nad.Spec != nil && nad.Spec.Config != nil && *nad.Spec.Config != "" {
		var conf map[string]any
		if err := json.Unmarshal([]byte(*nad.Spec.Config), &conf); err != nil {
			return fmt.Errorf("spec.config is not JSON: %w", err)
		}
	}
	return nil
}

// checkSecurityContextRules checks the API server's own rules for the agent's security
// context, which no OpenAPI schema expresses: allowPrivilegeEscalation=false is refused
// together with privileged or with the SYS_ADMIN capability.
func checkSecurityContextRules(t *testing.T, m *manifest) {
	t.Helper()
	sc := m.agent(t).SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		return
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("allowPrivilegeEscalation=false with privileged=true: the API server refuses the DaemonSet")
	}
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Add {
			if c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN" {
				t.Error("allowPrivilegeEscalation=false with SYS_ADMIN: the API server refuses the DaemonSet")
			}
		}
	}
}

// TestSeedCommandRendersWithHelmV3: the seed documents' command as written is helm v2's;
// helm v3 refuses its --name flag. With the release name given positionally, as helm v3
// wants, it renders every object in kube-system with the given hub, tag, pull policy,
// log level, and no excluded namespace.
func TestSeedCommandRendersWithHelmV3(t *testing.T) {
	asWritten := append([]string{"template", "--name=istio-cni"}, seedArgs...)
	asWritten = append(asWritten, chartDir)
	_, err := helm(t, asWritten...)
	if err == nil || !strings.Contains(err.Error(), "unknown flag: --name") {
		t.Fatalf("helm v3 with helm v2's --name: got %v, want it refused as an unknown flag (if helm now accepts it, update the README)", err)
	}

	m := mustRender(t, seedArgs...)
	for _, d := range m.docs {
		if d.kind == "ClusterRole" || d.kind == "ClusterRoleBinding" {
			continue
		}
		if d.ns != "kube-system" {
			t.Errorf("%s: namespace %q, want kube-system", d, d.ns)
		}
	}
	agent := m.agent(t)
	if agent.Image != "docker.io/example/install-cni:mytag" {
		t.Errorf("image %q, want docker.io/example/install-cni:mytag", agent.Image)
	}
	if agent.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy %q, want IfNotPresent", agent.ImagePullPolicy)
	}
	env := m.env(t)
	want := map[string]string{"PLUGIN_LOG_LEVEL": "debug", "EXCLUDE_NAMESPACES": ""}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("env %s=%q, want %q", k, env[k], v)
		}
	}
	conf := networkConfig(t, m)
	if got := conf["plugin_log_level"]; got != "debug" {
		t.Errorf("plugin_log_level %v, want debug", got)
	}
	if diff := cmp.Diff([]any{}, conf["exclude_namespaces"]); diff != "" {
		t.Errorf("exclude_namespaces (-want +got):\n%s", diff)
	}
}

// TestChartRefusesKubernetesOlderThanTheOldestSupported: Chart.yaml's kubeVersion is
// the oldest release of hack/kube/SUPPORTED, which helm enforces at install and
// template time; the newest renders with the pinned helm's own default too.
func TestChartRefusesKubernetesOlderThanTheOldestSupported(t *testing.T) {
	schemas := releaseSchemas(t)
	oldest := schemas[0].version
	minor, err := strconv.Atoi(strings.Split(oldest, ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version string
		ok      bool
	}{
		{oldest, true},
		{fmt.Sprintf("v1.%d.99", minor-1), false},
	} {
		_, err := helm(t, append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", tc.version}, withHub...)...)
		switch {
		case tc.ok && err != nil:
			t.Errorf("Kubernetes %s (the oldest supported) refused: %v", tc.version, err)
		case !tc.ok && err == nil:
			t.Errorf("Kubernetes %s rendered; want it refused by kubeVersion", tc.version)
		case !tc.ok && !strings.Contains(err.Error(), "chart requires kubeVersion"):
			t.Errorf("Kubernetes %s: %v; want helm's kubeVersion message", tc.version, err)
		}
	}
	if _, err := helm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, withHub...)...); err != nil {
		t.Errorf("helm template without --kube-version (the pinned helm's default): %v", err)
	}
}
