package nad

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/test/harness/background"
	"github.com/istio-cni/istio-cni/test/harness/childproc"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/poll"
)

const (
	agentNS   = "kube-system"
	ownerRole = "istio-cni"
)

// The controller's RBAC, exactly as the chart grants it (multus.meshedNamespaces):
// no update, no delete of any NetworkAttachmentDefinition.
var multusRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"k8s.cni.cncf.io"}, Resources: []string{"network-attachment-definitions"}, Verbs: []string{"create", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}, ResourceNames: []string{ownerRole}, Verbs: []string{"get"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{DefaultLeaseName}, Verbs: []string{"get", "update"}},
}

// testClient is what the agent builds: the three clients over one config.
type testClient struct {
	coordination coordinationv1client.CoordinationV1Interface
	dyn          dynamic.Interface
	md           metadata.Interface
}

func (c *testClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return c.coordination
}
func (c *testClient) Dynamic() dynamic.Interface   { return c.dyn }
func (c *testClient) Metadata() metadata.Interface { return c.md }

func newTestClient(t *testing.T, cfg *rest.Config) *testClient {
	t.Helper()
	cs, errCore := kubernetes.NewForConfig(cfg)
	dyn, errDynamic := dynamic.NewForConfig(cfg)
	md, errMetadata := metadata.NewForConfig(cfg)
	if err := errors.Join(errCore, errDynamic, errMetadata); err != nil {
		t.Fatal(err)
	}
	return &testClient{coordination: cs.CoordinationV1(), dyn: dyn, md: md}
}

// agentClient is a client of a ServiceAccount holding only multusRules.
func agentClient(t *testing.T, cp *controlplane.ControlPlane, name string) *testClient {
	t.Helper()
	return newTestClient(t, cp.ServiceAccountConfigForTest(t, agentNS, name, multusRules))
}

// installCRD serves the NetworkAttachmentDefinition API from the repository's CRD
// manifest, as Multus' installation does.
func installCRD(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "test", "crds", "network-attachment-definitions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatal(err)
	}
	admin := newTestClient(t, cp.AdminRESTConfig())
	crds := admin.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the NetworkAttachmentDefinition API", func() bool {
		_, err := admin.dyn.Resource(NADResource).List(t.Context(), metav1.ListOptions{})
		return err == nil
	})
}

func testConfig(identity string) Config {
	c := DefaultConfig()
	c.Enabled, c.MeshedNamespaces = true, true
	c.LeaseNamespace, c.Identity = agentNS, identity
	c.OwnerClusterRole = ownerRole
	c.StaticNamespaces = []string{"static", "helm-later"}
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 200*time.Millisecond
	return c
}

// start runs a controller until the returned stop is called (or the test ends).
func start(t *testing.T, cfg Config, client Client) (*Controller, func()) {
	t.Helper()
	c, err := New(cfg, client, Deps{MissingCRDRetry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c, background.Run(t, c.Run)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 30*time.Second, 20*time.Millisecond, what, cond)
}

func namespace(t *testing.T, cp *controlplane.ControlPlane, name string, labels map[string]string) {
	t.Helper()
	if err := cp.EnsureNamespace(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if labels == nil {
		return
	}
	ns, err := cp.AdminClient().CoreV1().Namespaces().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = labels
	if _, err := cp.AdminClient().CoreV1().Namespaces().Update(t.Context(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pod creates a pod with annotations, as it stands before the kubelet has started
// it (the moment a missing NetworkAttachmentDefinition fails its sandbox).
func pod(t *testing.T, cp *controlplane.ControlPlane, ns, name string, annotations map[string]string) {
	t.Helper()
	_, err := cp.AdminClient().CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

var meshed = map[string]string{SidecarAnnotation: `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`, multus.NetworksAnnotation: "istio-cni"}

func getNAD(t *testing.T, dyn dynamic.Interface, ns string) *unstructured.Unstructured {
	t.Helper()
	nad, err := dyn.Resource(NADResource).Namespace(ns).Get(t.Context(), multus.DefaultNetworkName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return nad
}

// createNAD plays whoever else makes the object: helm (the chart's list) or a user.
func createNAD(t *testing.T, dyn dynamic.Interface, ns string, labels map[string]string, config string) *unstructured.Unstructured {
	t.Helper()
	nad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": multus.DefaultNetworkName, "namespace": ns},
	}}
	nad.SetLabels(labels)
	if config != "" {
		nad.Object["spec"] = map[string]any{"config": config}
	}
	got, err := dyn.Resource(NADResource).Namespace(ns).Create(t.Context(), nad, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestNADIsCreatedWhereMeshedPodsNeedItByOneAgentAndOthersAreLeftAlone runs two
// replicas against a real kube-apiserver serving the CRD: exactly the namespaces
// that need the object get it, from the leader alone, marked as the agent's and
// owned by the chart's ClusterRole; objects made by others (helm's, a user's with
// its own config) are never changed; a deleted one comes back; a stopped agent
// leaves them in place and the other replica takes over; and when the ClusterRole
// is deleted (helm uninstall), Kubernetes' garbage collector removes the agent's
// objects and only those.
func TestNADIsCreatedWhereMeshedPodsNeedItByOneAgentAndOthersAreLeftAlone(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := newTestClient(t, cp.AdminRESTConfig())
	role, err := cp.AdminClient().RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ownerRole}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clientA, clientB := agentClient(t, cp, "agent-a"), agentClient(t, cp, "agent-b")

	// The replicas start before the API is served: they wait for it.
	a, stopA := start(t, testConfig("agent-a"), clientA)
	b, stopB := start(t, testConfig("agent-b"), clientB)
	installCRD(t, cp)

	// Helm's object (the chart's list) and a user's own, with its config, are there
	// before their namespaces are labelled for injection.
	namespace(t, cp, "static", nil)
	namespace(t, cp, "users", nil)
	helms := createNAD(t, admin.dyn, "static", map[string]string{ManagedByLabel: "Helm"}, "")
	users := createNAD(t, admin.dyn, "users", nil, `{"cniVersion":"0.3.1","type":"istio-cni","name":"istio-cni"}`)
	for ns, labels := range map[string]map[string]string{
		"bookinfo":   nil,                                                       // a meshed pod
		"labelled":   {"istio-injection": "enabled"},                            // no pod yet
		"revision":   {"istio.io/rev": "canary"},                                // no pod yet
		"asks":       nil,                                                       // a pod naming the network, not meshed
		"elsewhere":  nil,                                                       // a meshed pod naming default's object
		"disabled":   {"istio-injection": "disabled", "istio.io/rev": "canary"}, // no injection
		"plain":      nil,                                                       // a pod outside the mesh
		"static":     {"istio-injection": "enabled"},                            // the chart's list: helm's job
		"helm-later": {"istio-injection": "enabled"},                            // the chart's list, helm not there yet
		"users":      {"istio-injection": "enabled"},
	} {
		namespace(t, cp, ns, labels)
	}
	pod(t, cp, "bookinfo", "productpage", meshed)
	pod(t, cp, "asks", "client", map[string]string{multus.NetworksAnnotation: "istio-cni@net1"})
	pod(t, cp, "elsewhere", "web", map[string]string{SidecarAnnotation: "{}", multus.NetworksAnnotation: "default/istio-cni"})
	pod(t, cp, "plain", "web", map[string]string{multus.NetworksAnnotation: "macvlan"})
	pod(t, cp, "static", "web", meshed)
	pod(t, cp, "helm-later", "web", meshed)
	// The leader's one worker takes namespaces in the order it learnt of them: once
	// this last one has its object, every namespace above has been judged.
	namespace(t, cp, "zz-last", map[string]string{"istio-injection": "enabled"})
	needs := []string{"bookinfo", "labelled", "revision", "asks", "elsewhere", "zz-last"}

	for _, ns := range needs {
		waitFor(t, "NetworkAttachmentDefinition in "+ns, func() bool { return getNAD(t, admin.dyn, ns) != nil })
		nad := getNAD(t, admin.dyn, ns)
		if got := nad.GetLabels()[ManagedByLabel]; got != ManagedByValue {
			t.Errorf("%s: label %s=%q, want %q", ns, ManagedByLabel, got, ManagedByValue)
		}
		want := []metav1.OwnerReference{{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: ownerRole, UID: role.UID}}
		if diff := cmp.Diff(want, nad.GetOwnerReferences()); diff != "" {
			t.Errorf("%s: owner references (-want +got):\n%s", ns, diff)
		}
		if _, has := nad.Object["spec"]; has {
			t.Errorf("%s: spec %v, want none (Multus reads the config from its directory)", ns, nad.Object["spec"])
		}
	}
	waitFor(t, "a leader", func() bool { return a.Metrics().Leading.Load() || b.Metrics().Leading.Load() })
	leader, follower, stopLeader := a, b, stopA
	if b.Metrics().Leading.Load() {
		leader, follower, stopLeader = b, a, stopB
	}
	// The API server shows an object just before its creator counts it.
	waitFor(t, "creates counted", func() bool {
		return a.Metrics().Created.Load()+b.Metrics().Created.Load() >= uint64(len(needs))
	})
	for _, ns := range []string{"disabled", "plain", "helm-later"} {
		if nad := getNAD(t, admin.dyn, ns); nad != nil {
			t.Errorf("%s: NetworkAttachmentDefinition created, but no pod needs it or it is helm's to create", ns)
		}
	}
	for _, before := range []*unstructured.Unstructured{helms, users} {
		after := getNAD(t, admin.dyn, before.GetNamespace())
		if after == nil || after.GetResourceVersion() != before.GetResourceVersion() {
			t.Errorf("%s: the NetworkAttachmentDefinition someone else made was changed or deleted: %v", before.GetNamespace(), after)
		}
	}
	if n := leader.Metrics().Created.Load(); n != uint64(len(needs)) {
		t.Errorf("leader created %d, want %d", n, len(needs))
	}
	if n := follower.Metrics().Created.Load(); n != 0 || follower.Metrics().Leading.Load() {
		t.Errorf("follower acted: leading=%v created=%d", follower.Metrics().Leading.Load(), n)
	}

	// Deleted by someone: it comes back while a meshed pod needs it.
	old := getNAD(t, admin.dyn, "bookinfo")
	if err := admin.dyn.Resource(NADResource).Namespace("bookinfo").Delete(t.Context(), multus.DefaultNetworkName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted NetworkAttachmentDefinition back", func() bool {
		nad := getNAD(t, admin.dyn, "bookinfo")
		return nad != nil && nad.GetUID() != old.GetUID()
	})

	// The leader stops (a rolling update): its objects stay, the other replica
	// takes over and serves a namespace that gets its first meshed pod now.
	stopLeader()
	for _, ns := range needs {
		if getNAD(t, admin.dyn, ns) == nil {
			t.Errorf("%s: NetworkAttachmentDefinition gone after the agent stopped", ns)
		}
	}
	namespace(t, cp, "late", nil)
	pod(t, cp, "late", "reviews", meshed)
	waitFor(t, "NetworkAttachmentDefinition in late, from the new leader", func() bool { return getNAD(t, admin.dyn, "late") != nil })
	waitFor(t, "the other replica to count its create", func() bool { return follower.Metrics().Created.Load() == 1 })
	if !follower.Metrics().Leading.Load() {
		t.Error("the other replica created, but does not hold the lease")
	}
	stopA()
	stopB()

	// helm uninstall deletes the ClusterRole: the garbage collector deletes the
	// agent's objects, and only those.
	startGarbageCollector(t, cp)
	if err := cp.AdminClient().RbacV1().ClusterRoles().Delete(t.Context(), ownerRole, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range append(needs, "late") {
		waitFor(t, "the garbage collector to delete the agent's object in "+ns, func() bool { return getNAD(t, admin.dyn, ns) == nil })
	}
	for _, ns := range []string{"static", "users"} {
		if getNAD(t, admin.dyn, ns) == nil {
			t.Errorf("%s: the NetworkAttachmentDefinition someone else made is gone after uninstall", ns)
		}
	}
}

// startGarbageCollector runs kube-controller-manager's garbage collector (and no
// other controller) against cp until the test ends.
func startGarbageCollector(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	bin, err := controlplane.BinDir(t.Context(), controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	launcher := childproc.NewLauncher()
	p, err := launcher.Start("kube-controller-manager", filepath.Join(bin, "kube-controller-manager"), []string{
		"--kubeconfig=" + cp.AdminKubeconfig(),
		"--controllers=garbagecollector",
		"--leader-elect=false",
		"--secure-port=0",
	}, nil, filepath.Join(t.TempDir(), "kube-controller-manager.log"))
	if err != nil {
		launcher.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", p.LogPath, p.Tail(40))
		}
		if err := p.Stop(5 * time.Second); err != nil {
			t.Errorf("stop kube-controller-manager: %v", err)
		}
		launcher.Close()
	})
}
