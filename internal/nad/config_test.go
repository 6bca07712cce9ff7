package nad

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/test/harness/envmap"
)

var env = envmap.Lookup

func TestConfigFromEnv(t *testing.T) {
	c, err := ConfigFromEnv(env())
	if err != nil || c.Enabled || c.MeshedNamespaces {
		t.Errorf("off by default: %+v, %v", c, err)
	}
	c, err = ConfigFromEnv(env(multus.EnvEnabled, "true", EnvMeshedNamespaces, "true", EnvPodNamespace, "kube-system", "POD_NAME", "istio-cni-node-x",
		EnvStaticNamespaces, "default, bookinfo,,default", EnvOwnerClusterRole, "istio-cni"))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Enabled, want.MeshedNamespaces = true, true
	want.StaticNamespaces = []string{"default", "bookinfo"}
	want.OwnerClusterRole, want.LeaseNamespace, want.Identity = "istio-cni", "kube-system", "istio-cni-node-x"
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if c.LeaseDuration != time.Minute || c.Network != "istio-cni" {
		t.Errorf("defaults: %+v", c)
	}
}

func TestConfigRejectsBadSettingsNamingThem(t *testing.T) {
	on := []string{multus.EnvEnabled, "true", EnvMeshedNamespaces, "true", EnvPodNamespace, "kube-system", "POD_NAME", "p"}
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{multus.EnvEnabled, "yes please"}, []string{multus.EnvEnabled}},
		{[]string{EnvMeshedNamespaces, "true"}, []string{EnvMeshedNamespaces, multus.EnvEnabled}},
		{[]string{multus.EnvEnabled, "true", multus.EnvNetworkName, "Istio CNI"}, []string{multus.EnvNetworkName}},
		{append(on[:4:4], EnvPodNamespace, "kube-system"), []string{EnvIdentity, "POD_NAME"}},
		{append(on[:4:4], "POD_NAME", "p"), []string{EnvPodNamespace}},
		{append(on, EnvStaticNamespaces, "default,Not_A_Namespace"), []string{EnvStaticNamespaces, "Not_A_Namespace"}},
		{append(on, EnvOwnerClusterRole, "a/b"), []string{EnvOwnerClusterRole}},
		{append(on, EnvLeaseDuration, "5s"), []string{EnvLeaseDuration}},
	} {
		envmap.CheckRejected(t, ConfigFromEnv, tc.env, tc.want...)
	}
}

func TestInjectionLabelsAreIstios(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"istio-injection": "enabled"}, true},
		{map[string]string{"istio.io/rev": "canary"}, true},
		{map[string]string{"istio.io/rev": "canary", "istio-injection": "disabled"}, false},
		{map[string]string{"istio-injection": "disabled"}, false},
		{map[string]string{"istio-injection": "true"}, false},
		{nil, false},
	} {
		if got := injectionLabelled(tc.labels); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.labels, got, tc.want)
		}
	}
}

// The informer passes an already reduced pod through the transform again when an
// initial list replaces its store: the mark must survive.
func TestSlimPodKeepsItsMarkWhenReducedTwice(t *testing.T) {
	for _, tc := range []struct {
		annotations map[string]string
		needs       bool
	}{
		{map[string]string{SidecarAnnotation: "{}"}, true},
		{map[string]string{multus.NetworksAnnotation: "istio-cni"}, true},
		{map[string]string{multus.NetworksAnnotation: "default/istio-cni"}, false},
		{map[string]string{"example.com/x": "y"}, false},
	} {
		p := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "app", Annotations: tc.annotations}}
		once := slimPod(p, multus.DefaultNetworkName).(*metav1.PartialObjectMetadata)
		twice := slimPod(once, multus.DefaultNetworkName).(*metav1.PartialObjectMetadata)
		for i, got := range []*metav1.PartialObjectMetadata{once, twice} {
			if marked := got.Annotations[needsMark] != ""; marked != tc.needs {
				t.Errorf("%v, reduced %d times: marked %v, want %v", tc.annotations, i+1, marked, tc.needs)
			}
			if len(got.Annotations) > 1 {
				t.Errorf("%v: kept %v", tc.annotations, got.Annotations)
			}
		}
	}
}
