package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const (
	repoRoot  = "../.."
	chartDir  = repoRoot + "/charts/istio-cni"
	release   = "istio-cni"
	namespace = "kube-system"
)

// profiles are the platform values files shipped with the chart: default and one per
// platform of Istio's platform switch.
var profiles = []string{"default", "gke", "k3d", "k3s", "microk8s", "minikube", "openshift"}

func profileFile(name string) string {
	return filepath.Join(chartDir, "profiles", name+".yaml")
}

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// tool returns the path of a pinned tool (helm, kubectl-validate). The tools live in a
// cache outside the repository that hack/tools/install.sh fills (building them on the
// first run) and names on its last line of output.
func tool(t *testing.T, name string) string {
	t.Helper()
	toolsOnce.Do(func() {
		cmd := exec.Command(filepath.Join(repoRoot, "hack/tools/install.sh"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			toolsErr = fmt.Errorf("hack/tools/install.sh: %w\n%s", err, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		toolsDir = lines[len(lines)-1]
	})
	if toolsErr != nil {
		t.Fatalf("cannot install the pinned tools: %v", toolsErr)
	}
	path := filepath.Join(toolsDir, name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("hack/tools/install.sh printed %s but %s is not there: %v", toolsDir, name, err)
	}
	return path
}

var helmInputsOnce sync.Once

// readHelmInputs reads every file helm is given here (the chart, and the values files
// under testdata) from this process: go test caches a package's result keyed on the
// files the test binary itself opened, and helm, another process, opens these. Without
// it a chart edit alone left the result cached, and a broken chart passed.
func readHelmInputs(t *testing.T) {
	t.Helper()
	helmInputsOnce.Do(func() {
		for _, dir := range []string{chartDir, "testdata"} {
			err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				_, err = os.ReadFile(path)
				return err
			})
			if err != nil {
				t.Fatalf("reading the chart's inputs: %v", err)
			}
		}
	})
}

// helm runs the pinned helm with args and returns its stdout; a failure carries stderr.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	readHelmInputs(t)
	cmd := exec.Command(tool(t, "helm"), args...)
	// No user config or cache may influence the render.
	home := t.TempDir()
	// HOME too: with a cluster to talk to, helm keeps a discovery cache in
	// $HOME/.kube/cache, which would be left on the host.
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home, "HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// withHub is what every render says besides its own values: where the image is.
// The chart in the repository names no registry and refuses to render without hub
// (TestChartWithoutHubFailsSayingHowToPush). It sets hub's default (defaultHub), as
// the chart that make push publishes has it, so that a values file of a test that
// sets hub (or sets it empty, as Istio's default values do) is read as a user's.
var withHub = []string{"--set", "defaultHub=registry.example.com/mesh"}

// templateArgs is `helm template istio-cni <chart> --namespace kube-system` plus
// withHub and extra. templateArgs renders for the newest supported release
// (hack/kube/DEFAULT): the chart's kubeVersion refuses older ones.
func templateArgs(extra ...string) []string {
	args := append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", defaultKubeVersion()}, withHub...)
	return append(args, extra...)
}

func defaultKubeVersion() string {
	data, err := os.ReadFile(filepath.Join(repoRoot, "hack", "kube", "DEFAULT"))
	if err != nil {
		panic(err) // the repository is incomplete
	}
	return strings.TrimSpace(string(data))
}

// manifest is a rendered chart: the raw text, each document, and the decoded objects.
type manifest struct {
	raw  []byte
	docs []document
}

type document struct {
	raw        []byte
	apiVersion string
	kind       string
	name       string
	ns         string
	object     runtime.Object // nil for kinds outside client-go's scheme
}

func (d document) String() string { return fmt.Sprintf("%s %s/%s", d.kind, d.ns, d.name) }

// strictDecoder decodes YAML or JSON into client-go's typed objects and fails on unknown
// or duplicate fields.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// render runs helm template with extra arguments and parses the result; every document
// of a kind client-go knows must decode strictly.
func render(t *testing.T, extra ...string) (*manifest, error) {
	t.Helper()
	out, err := helm(t, templateArgs(extra...)...)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(out)
	if err != nil {
		t.Fatalf("helm template %s: %v", strings.Join(extra, " "), err)
	}
	return m, nil
}

// mustRender is render for values that must be accepted.
func mustRender(t *testing.T, extra ...string) *manifest {
	t.Helper()
	m, err := render(t, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func parseManifest(out []byte) (*manifest, error) {
	m := &manifest{raw: out}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("split documents: %w", err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(raw, &head); err != nil {
			return nil, fmt.Errorf("document %d is not YAML: %w\n%s", len(m.docs), err, raw)
		}
		if head.Kind == "" { // only comments
			continue
		}
		doc := document{raw: raw, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, ns: head.Metadata.Namespace}
		if head.APIVersion == "" || head.Metadata.Name == "" {
			return nil, fmt.Errorf("%s lacks apiVersion or metadata.name", doc)
		}
		obj, gvk, err := strictDecoder.Decode(raw, nil, nil)
		switch {
		case err == nil:
			if gvk.Kind != head.Kind {
				return nil, fmt.Errorf("%s decoded as %s", doc, gvk.Kind)
			}
			doc.object = obj
		case runtime.IsNotRegisteredError(err):
			// Outside the scheme (NetworkAttachmentDefinition): checked structurally.
		default:
			return nil, fmt.Errorf("%s does not decode strictly: %w", doc, err)
		}
		m.docs = append(m.docs, doc)
	}
	return m, nil
}

// find returns the document of kind and name, or nil.
func (m *manifest) find(kind, name string) *document {
	for i := range m.docs {
		if m.docs[i].kind == kind && m.docs[i].name == name {
			return &m.docs[i]
		}
	}
	return nil
}

func (m *manifest) all(kind string) []document {
	return slices.DeleteFunc(slices.Clone(m.docs), func(d document) bool { return d.kind != kind })
}

// object returns the object of kind and name as a T, failing the test when the
// render has none.
func object[T any](t *testing.T, m *manifest, kind, name string) T {
	t.Helper()
	d := m.find(kind, name)
	if d == nil {
		t.Fatalf("no %s %s in the render", kind, name)
	}
	return d.object.(T)
}

func (m *manifest) daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	return object[*appsv1.DaemonSet](t, m, "DaemonSet", "istio-cni-node")
}

// agent returns the install-cni container.
func (m *manifest) agent(t *testing.T) corev1.Container {
	t.Helper()
	ds := m.daemonSet(t)
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "install-cni" {
			return c
		}
	}
	t.Fatalf("DaemonSet istio-cni-node has no install-cni container")
	return corev1.Container{}
}

func (m *manifest) configMap(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	return object[*corev1.ConfigMap](t, m, "ConfigMap", "istio-cni-config")
}

func (m *manifest) clusterRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	return object[*rbacv1.ClusterRole](t, m, "ClusterRole", "istio-cni")
}

// env returns the agent's environment: literal values, and for valueFrom a description
// of the source ("configMapKeyRef:<name>/<key>", "fieldRef:<path>").
func (m *manifest) env(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range m.agent(t).Env {
		if _, dup := out[e.Name]; dup {
			t.Errorf("env %s is set twice", e.Name)
		}
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			out[e.Name] = "configMapKeyRef:" + e.ValueFrom.ConfigMapKeyRef.Name + "/" + e.ValueFrom.ConfigMapKeyRef.Key
		case e.ValueFrom.FieldRef != nil:
			out[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			out[e.Name] = "resourceFieldRef:" + e.ValueFrom.ResourceFieldRef.Resource
		default:
			t.Errorf("env %s has an unexpected source", e.Name)
		}
	}
	return out
}

// hostPaths maps each hostPath volume mounted by the agent to its mount path.
func (m *manifest) hostPaths(t *testing.T) map[string]string {
	t.Helper()
	ds := m.daemonSet(t)
	paths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	out := map[string]string{}
	for _, vm := range m.agent(t).VolumeMounts {
		if host, ok := paths[vm.Name]; ok {
			out[host] = vm.MountPath
		}
	}
	return out
}
