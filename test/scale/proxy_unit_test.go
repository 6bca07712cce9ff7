package scale

import (
	"encoding/binary"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestClassifyNamesTheVerbResourceAndScopeOfARequest(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		want        call
	}{
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&watch=true", call{Verb: "watch", Resource: "pods", FieldSelector: "spec.nodeName=node-1"}},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&limit=500", call{Verb: "list", Resource: "pods", FieldSelector: "spec.nodeName=node-1"}},
		{"GET", "/api/v1/namespaces/istio-system/pods?labelSelector=k8s-app%3Distio-cni-node", call{Verb: "list", Resource: "pods", Namespace: "istio-system", LabelSelector: "k8s-app=istio-cni-node"}},
		{"GET", "/api/v1/namespaces/istio-system/pods/agent-1", call{Verb: "get", Resource: "pods", Namespace: "istio-system", Name: "agent-1"}},
		{"GET", "/api/v1/namespaces", call{Verb: "list", Resource: "namespaces"}},
		{"GET", "/api/v1/nodes/node-1", call{Verb: "get", Resource: "nodes", Name: "node-1"}},
		{"PATCH", "/api/v1/nodes/node-1", call{Verb: "patch", Resource: "nodes", Name: "node-1"}},
		{"DELETE", "/api/v1/namespaces/apps/pods/web", call{Verb: "delete", Resource: "pods", Namespace: "apps", Name: "web"}},
		{"POST", "/api/v1/namespaces/istio-system/serviceaccounts/istio-cni-plugin/token", call{Verb: "create", Resource: "serviceaccounts", Namespace: "istio-system", Name: "istio-cni-plugin", Subresource: "token"}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/istio-system/leases/istio-cni-taint", call{Verb: "update", Resource: "leases", Namespace: "istio-system", Name: "istio-cni-taint"}},
		{"GET", "/apis/apps/v1/namespaces/istio-system/daemonsets/istio-cni-node", call{Verb: "get", Resource: "daemonsets", Namespace: "istio-system", Name: "istio-cni-node"}},
		{"GET", "/version", call{Verb: "get", Resource: "/version"}},
	} {
		t.Run(tc.method+" "+tc.url, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, classify(httptest.NewRequest(tc.method, tc.url, nil))); diff != "" {
				t.Errorf("classify (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFrameCounterCountsProtobufEventsSplitAcrossReads(t *testing.T) {
	var stream []byte
	for _, n := range []int{10, 3000, 0, 5} {
		stream = binary.BigEndian.AppendUint32(stream, uint32(n))
		stream = append(stream, make([]byte, n)...)
	}
	// Every split, including inside a length prefix.
	for cut := range len(stream) {
		f := &frameCounter{protobuf: true}
		if got := f.count(stream[:cut]) + f.count(stream[cut:]); got != 4 {
			t.Fatalf("cut at %d: %d events, want 4", cut, got)
		}
	}
	if got := (&frameCounter{}).count([]byte("{\"type\":\"ADDED\"}\n{\"type\":\"DELETED\"}\n")); got != 2 {
		t.Errorf("JSON: %d events, want 2", got)
	}
}
