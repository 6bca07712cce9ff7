package multus

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseNetworksReadsBothOfMultusForms(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []Network
	}{
		{"", nil},
		{"istio-cni", []Network{{Name: "istio-cni"}}},
		{" istio-cni , bookinfo/macvlan@eth1 ", []Network{{Name: "istio-cni"}, {Namespace: "bookinfo", Name: "macvlan"}}},
		{"default/istio-cni@net1", []Network{{Namespace: "default", Name: "istio-cni"}}},
		{`[{"name":"istio-cni"}]`, []Network{{Name: "istio-cni"}}},
		{`[{"name":"macvlan","namespace":"infra","interface":"eth1","ips":["10.1.1.1/24"]},{"name":"istio-cni"}]`,
			[]Network{{Namespace: "infra", Name: "macvlan"}, {Name: "istio-cni"}}},
	} {
		got, err := ParseNetworks(tc.value)
		if err != nil {
			t.Errorf("%q: %v", tc.value, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.value, diff)
		}
	}
}

func TestParseNetworksRefusesWhatMultusWouldNotReadNamingTheValue(t *testing.T) {
	for _, v := range []string{"istio-cni,", "a/b/c", "ns/", "@eth0", `[{"namespace":"x"}]`, `[{"name":`, `{"name":"istio-cni"}`, `"istio-cni"`} {
		_, err := ParseNetworks(v)
		if err == nil {
			t.Errorf("%q accepted", v)
			continue
		}
		if !strings.Contains(err.Error(), NetworksAnnotation) {
			t.Errorf("%q: error %q does not name the annotation", v, err)
		}
	}
}

func TestAttachesAnyNamespaceAttachesHereOnlyTheOwn(t *testing.T) {
	for _, tc := range []struct {
		value         string
		attaches      bool
		attachesHere  bool // for a pod in namespace "app"
		wantParseFail bool
	}{
		{"istio-cni", true, true, false},
		{"app/istio-cni", true, true, false},
		{"default/istio-cni", true, false, false},
		{`[{"name":"istio-cni","namespace":"app"}]`, true, true, false},
		{"macvlan", false, false, false},
		{"", false, false, false},
		{"istio-cni,", false, false, true},
	} {
		ann := map[string]string{NetworksAnnotation: tc.value}
		got, err := Attaches(ann, "istio-cni")
		if got != tc.attaches || (err != nil) != tc.wantParseFail {
			t.Errorf("Attaches(%q) = %v, %v; want %v, parse error %v", tc.value, got, err, tc.attaches, tc.wantParseFail)
		}
		if got := AttachesHere(ann, "app", "istio-cni"); got != tc.attachesHere {
			t.Errorf("AttachesHere(%q) = %v, want %v", tc.value, got, tc.attachesHere)
		}
	}
	if got, err := Attaches(nil, "istio-cni"); got || err != nil {
		t.Errorf("no annotation: %v, %v", got, err)
	}
}
