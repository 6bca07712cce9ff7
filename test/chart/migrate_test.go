package chart

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// TestIstiosReleaseIsTakenOverByAnUpgradeInPlace: the README's way from Istio's
// istio-cni chart to this one, against a real API server. Both charts fix the names
// of their ClusterRole and ClusterRoleBinding (istio-cni), so Helm refuses to
// install this chart as a release of its own while Istio's release is there, with
// its ownership error; `helm upgrade` of Istio's release with this chart succeeds,
// and updates Istio's DaemonSet in place (same object, same selector, this chart's
// image: a rolling update, node by node), removing what only Istio's chart had.
func TestIstiosReleaseIsTakenOverByAnUpgradeInPlace(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	kc := []string{"--kubeconfig", cp.AdminKubeconfig()}
	const istioNS = "istio-system"
	if _, err := helm(t, append([]string{"install", "istio-cni", filepath.Join("testdata", "istio-release"), "-n", istioNS, "--create-namespace"}, kc...)...); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	client := cp.AdminClient()
	before, err := client.AppsV1().DaemonSets(istioNS).Get(ctx, "istio-cni-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A release of its own: refused by Helm, naming the ClusterRole.
	_, err = helm(t, append(append([]string{"install", "mesh-cni", chartDir, "-n", namespace}, withHub...), kc...)...)
	if err == nil || !strings.Contains(err.Error(), `ClusterRole "istio-cni"`) || !strings.Contains(err.Error(), "cannot be imported into the current release") {
		t.Fatalf("helm install beside Istio's release: %v; want Helm's ownership error naming ClusterRole istio-cni", err)
	}

	// The upgrade in place.
	if _, err := helm(t, append(append([]string{"upgrade", "istio-cni", chartDir, "-n", istioNS}, withHub...), kc...)...); err != nil {
		t.Fatalf("helm upgrade of Istio's release with this chart: %v", err)
	}
	after, err := client.AppsV1().DaemonSets(istioNS).Get(ctx, "istio-cni-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID != before.UID {
		t.Errorf("the DaemonSet was recreated (uid %s, was %s): every node would lose its agent at once", after.UID, before.UID)
	}
	if got := after.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(got, "registry.example.com/mesh/install-cni") {
		t.Errorf("the DaemonSet runs %s after the upgrade, want this chart's image", got)
	}
	if s := after.Spec.UpdateStrategy; s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("update strategy %+v, want a rolling update one node at a time", s)
	}
	cr, err := client.RbacV1().ClusterRoles().Get(ctx, "istio-cni", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cr.Labels["helm.sh/chart"]; !strings.HasPrefix(got, "istio-cni-0.") {
		t.Errorf("ClusterRole istio-cni after the upgrade is labelled helm.sh/chart=%q, want this chart's", got)
	}
	if _, err := client.RbacV1().ClusterRoles().Get(ctx, "istio-cni-repair-role", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Istio's istio-cni-repair-role is still there after the upgrade (%v)", err)
	}
}

// TestAnotherPSPClusterRoleIsAnUpgrade: a RoleBinding's roleRef cannot change (the API
// server refuses it), so the binding of psp_cluster_role is one per ClusterRole: a
// helm upgrade that names another ClusterRole replaces the binding instead of failing
// on it, against a real API server, and one that names none removes it.
func TestAnotherPSPClusterRoleIsAnUpgrade(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	kc := []string{"--kubeconfig", cp.AdminKubeconfig()}
	client := cp.AdminClient()
	bound := func() []string {
		t.Helper()
		rbs, err := client.RbacV1().RoleBindings(namespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var roles []string
		for _, rb := range rbs.Items {
			if rb.RoleRef.Kind == "ClusterRole" {
				roles = append(roles, rb.RoleRef.Name)
			}
		}
		return roles
	}
	for i, role := range []string{"psp:restricted", "scc:privileged", ""} {
		verb := "upgrade"
		if i == 0 {
			verb = "install"
		}
		args := append(append([]string{verb, release, chartDir, "-n", namespace, "--set", "psp_cluster_role=" + role}, withHub...), kc...)
		if _, err := helm(t, args...); err != nil {
			t.Fatalf("helm %s with psp_cluster_role=%q: %v", verb, role, err)
		}
		var want []string
		if role != "" {
			want = []string{role}
		}
		if got := bound(); !slices.Equal(got, want) {
			t.Errorf("after helm %s with psp_cluster_role=%q the agent is bound to the ClusterRoles %q, want %q", verb, role, got, want)
		}
	}
}
