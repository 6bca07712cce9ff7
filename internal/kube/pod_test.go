package kube

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

// A trimmed API server response: the fields the plugin reads plus unknown ones.
const apiPod = `{
  "kind": "Pod", "apiVersion": "v1",
  "metadata": {
    "name": "web-1", "namespace": "default", "uid": "0b5e-uid",
    "labels": {"app": "web"},
    "annotations": {"sidecar.istio.io/status": "{}"},
    "deletionTimestamp": "2025-01-02T03:04:05Z",
    "managedFields": [{"manager": "kubelet"}]
  },
  "spec": {
    "nodeName": "node-a",
    "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
    "initContainers": [{"name": "istio-proxy", "image": "proxyv2", "restartPolicy": "Always",
      "args": ["proxy", "sidecar"], "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {}}}]}],
    "containers": [{"name": "app", "image": "nginx", "ports": [{"containerPort": 8080, "protocol": "TCP"}],
      "securityContext": {"runAsUser": 1001, "runAsGroup": 3000, "privileged": false}}],
    "volumes": []
  },
  "status": {"phase": "Pending", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}], "conditions": []}
}`

func TestDecodePodReadsThePluginsFieldsAndIgnoresTheRest(t *testing.T) {
	p, err := DecodePod([]byte(apiPod))
	if err != nil {
		t.Fatal(err)
	}
	del := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	want := &Pod{
		Metadata: ObjectMeta{
			Name: "web-1", Namespace: "default", UID: "0b5e-uid",
			Labels:            map[string]string{"app": "web"},
			Annotations:       map[string]string{"sidecar.istio.io/status": "{}"},
			DeletionTimestamp: &del,
		},
		Spec: PodSpec{
			NodeName:        "node-a",
			SecurityContext: &PodSecurityContext{RunAsUser: ptr[int64](1000)},
			InitContainers: []Container{{Name: "istio-proxy", Image: "proxyv2", RestartPolicy: "Always",
				Args: []string{"proxy", "sidecar"}, Env: []EnvVar{{Name: "A", Value: "1"}, {Name: "B"}}}},
			Containers: []Container{{Name: "app", Image: "nginx", Ports: []ContainerPort{{ContainerPort: 8080, Protocol: "TCP"}},
				SecurityContext: &SecurityContext{RunAsUser: ptr[int64](1001), RunAsGroup: ptr[int64](3000)}}},
		},
		Status: PodStatus{Phase: "Pending", PodIP: "10.0.0.5", PodIPs: []PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}}},
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("decoded pod (-want +got):\n%s", diff)
	}
}

func TestDecodePodRejectsWhatIsNotAPod(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":      `<html>`,
		"status object": `{"kind":"Status","status":"Failure","reason":"NotFound"}`,
		"wrong type":    `{"metadata":{"name":"a","namespace":"b","labels":["x"]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodePod([]byte(body)); err == nil || !strings.HasPrefix(err.Error(), "decode pod:") {
				t.Errorf("DecodePod(%s) = %v, want a decode pod error", body, err)
			}
		})
	}
}

func TestContainerFindsInitAndRegularContainers(t *testing.T) {
	p, _ := DecodePod([]byte(apiPod))
	if c, isInit, ok := p.Container("istio-proxy"); !ok || !isInit || !c.IsNativeSidecar() {
		t.Errorf("istio-proxy: ok=%v init=%v native=%v, want an init native sidecar", ok, isInit, c.IsNativeSidecar())
	}
	if c, isInit, ok := p.Container("app"); !ok || isInit || c.IsNativeSidecar() {
		t.Errorf("app: ok=%v init=%v, want a regular container", ok, isInit)
	}
	if _, _, ok := p.Container("missing"); ok {
		t.Error("found a container that does not exist")
	}
	var names []string
	for _, c := range p.AllContainers() {
		names = append(names, c.Name)
	}
	if diff := cmp.Diff([]string{"istio-proxy", "app"}, names); diff != "" {
		t.Errorf("AllContainers order, init first (-want +got):\n%s", diff)
	}
}

func TestGetenvLastEntryWinsAndValueFromReadsEmpty(t *testing.T) {
	c := Container{Env: []EnvVar{{Name: "X", Value: "1"}, {Name: "Y"}, {Name: "X", Value: "2"}}}
	if v, ok := c.Getenv("X"); !ok || v != "2" {
		t.Errorf("X = %q, %v; want 2, true", v, ok)
	}
	if v, ok := c.Getenv("Y"); !ok || v != "" {
		t.Errorf("Y = %q, %v; want empty, true", v, ok)
	}
	if _, ok := c.Getenv("Z"); ok {
		t.Error("Z found")
	}
}

func TestRunAsFallsBackToThePodSecurityContext(t *testing.T) {
	podSC := &PodSecurityContext{RunAsUser: ptr[int64](1000), RunAsGroup: ptr[int64](2000)}
	for _, tc := range []struct {
		name     string
		c        Container
		pod      *PodSecurityContext
		uid, gid *int64
	}{
		{"neither set", Container{}, nil, nil, nil},
		{"pod only", Container{}, podSC, ptr[int64](1000), ptr[int64](2000)},
		{"container wins", Container{SecurityContext: &SecurityContext{RunAsUser: ptr[int64](1337), RunAsGroup: ptr[int64](1337)}}, podSC, ptr[int64](1337), ptr[int64](1337)},
		{"per field", Container{SecurityContext: &SecurityContext{RunAsUser: ptr[int64](1337)}}, podSC, ptr[int64](1337), ptr[int64](2000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid, gid := tc.c.RunAs(tc.pod)
			if diff := cmp.Diff([]*int64{tc.uid, tc.gid}, []*int64{uid, gid}); diff != "" {
				t.Errorf("RunAs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIPsPrefersPodIPsAndFallsBackToPodIP(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status PodStatus
		want   []netip.Addr
	}{
		{"none", PodStatus{}, nil},
		{"podIP only", PodStatus{PodIP: "10.0.0.1"}, []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
		{"podIPs in order", PodStatus{PodIP: "10.0.0.1", PodIPs: []PodIP{{IP: "fd00::1"}, {IP: "10.0.0.1"}}},
			[]netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.1")}},
		{"garbage dropped", PodStatus{PodIPs: []PodIP{{IP: "nope"}, {IP: "::ffff:10.0.0.2"}}}, []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pod{Status: tc.status}
			if diff := cmp.Diff(tc.want, p.IPs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("IPs (-want +got):\n%s", diff)
			}
		})
	}
}
