package kube

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	k8sptr "k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// encodeProtobuf is obj as the API server sends it in protobuf: the magic, then the
// envelope with obj's kind and its bytes (the API machinery's own serializer).
func encodeProtobuf(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// protoPods are pods that set every field the plugin reads, and much it skips.
func protoPods() map[string]*corev1.Pod {
	typeMeta := metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	deleted := metav1.NewTime(time.Date(2026, 11, 28, 7, 30, 5, 0, time.UTC))
	sidecar := corev1.Container{
		Name: "istio-proxy", Image: "proxyv2:1.29", Args: []string{"proxy", "sidecar", ""},
		RestartPolicy: k8sptr.To(corev1.ContainerRestartPolicyAlways),
		Env: []corev1.EnvVar{
			{Name: "ISTIO_META_DNS_CAPTURE", Value: "true"}, {Name: "EMPTY"},
			{Name: "FROM_FIELD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		},
		Ports: []corev1.ContainerPort{
			{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP},
			{ContainerPort: 15021, Protocol: corev1.ProtocolUDP, HostPort: 15021},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: k8sptr.To[int64](1337), RunAsGroup: k8sptr.To[int64](1337), Privileged: k8sptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	return map[string]*corev1.Pod{
		"minimal": {TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}},
		"sidecar-injected": {
			TypeMeta: typeMeta,
			ObjectMeta: metav1.ObjectMeta{
				Name: "web-5d9c", Namespace: "shop", UID: "4c3e1f0a-0b1c-4d2e-9f00-112233445566",
				ResourceVersion: "123", GenerateName: "web-", Generation: 3,
				Labels:          map[string]string{"app": "web", "security.istio.io/tlsMode": "istio", "empty": ""},
				Annotations:     map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`, "traffic.sidecar.istio.io/excludeOutboundPorts": "15020,9090", "é": "ü"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "u"}},
				Finalizers:      []string{"example.com/keep"},
				ManagedFields: []metav1.ManagedFieldsEntry{{
					Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{}}}`)},
				}},
				CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)),
			},
			Spec: corev1.PodSpec{
				NodeName: "node-1",
				Volumes:  []corev1.Volume{{Name: "istio-envoy", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				InitContainers: []corev1.Container{
					{Name: "istio-validation", Image: "proxyv2:1.29", Args: []string{"istio-iptables", "--run-validation"},
						SecurityContext: &corev1.SecurityContext{RunAsUser: k8sptr.To[int64](1337)}},
					sidecar,
				},
				Containers: []corev1.Container{
					{Name: "app", Image: "app:1", Command: []string{"/app"}, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}},
					{Name: "negative", SecurityContext: &corev1.SecurityContext{RunAsUser: k8sptr.To[int64](-1), RunAsGroup: k8sptr.To[int64](-9223372036854775808)}},
					{Name: "empty-security-context", SecurityContext: &corev1.SecurityContext{}},
					{Name: "big-port", Ports: []corev1.ContainerPort{{ContainerPort: 2147483647}, {ContainerPort: -1}}},
				},
				SecurityContext: &corev1.PodSecurityContext{RunAsUser: k8sptr.To[int64](1000), RunAsGroup: k8sptr.To[int64](0), FSGroup: k8sptr.To[int64](2000)},
				HostNetwork:     false,
			},
			Status: corev1.PodStatus{
				Phase: corev1.PodRunning, PodIP: "10.1.2.3",
				PodIPs:     []corev1.PodIP{{IP: "10.1.2.3"}, {IP: "fd00::3"}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			},
		},
		// metav1.Time{} is JSON's null, while the API machinery's protobuf gives
		// it as an empty message.
		"zero-deletion-timestamp": {
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: "zero", Namespace: "ns", DeletionTimestamp: &metav1.Time{}},
		},
		// Kubernetes' protobuf strings are any bytes (an object written in
		// protobuf keeps them), while its JSON writes each byte that is not UTF-8
		// as U+FFFD.
		"not-utf8": {
			TypeMeta: typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: "p\xff", Namespace: "ns",
				Labels:      map[string]string{"\xfe": "\xc3", "ok": "\xed\xa0\x80"},
				Annotations: map[string]string{"traffic.sidecar.istio.io/excludeOutboundPorts": "15020,\xff\xff9090", "u": "\uFFFD\xef\xbf"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "\x80", Args: []string{"a\xffb"},
				Env: []corev1.EnvVar{{Name: "E", Value: "\xf4\x90\x80\x80"}}}}},
			Status: corev1.PodStatus{PodIP: "10.0.0.1\xff"},
		},
		"being-deleted": {
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: "ns", UID: "u2", DeletionTimestamp: &deleted, DeletionGracePeriodSeconds: k8sptr.To[int64](30)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{sidecar}, SecurityContext: &corev1.PodSecurityContext{}},
			Status:     corev1.PodStatus{Phase: corev1.PodSucceeded},
		},
	}
}

// TestProtobufPodDecodesAsItsJSON: a pod encoded as the API server encodes it in
// protobuf decodes to what its JSON decodes to, for pods that set every field the
// plugin reads (init containers and a native sidecar, env, ports, both security
// contexts, negative and extreme numbers, deletion, dual-stack addresses) beside
// fields it skips (managed fields, volumes, conditions).
func TestProtobufPodDecodesAsItsJSON(t *testing.T) {
	for name, pod := range protoPods() {
		t.Run(name, func(t *testing.T) {
			js, err := json.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			var want, got Pod
			if err := decodePod(js, &want); err != nil {
				t.Fatalf("JSON: %v", err)
			}
			pb := encodeProtobuf(t, pod)
			if !isProtobuf(pb) || isProtobuf(js) {
				t.Fatalf("isProtobuf: %v for protobuf, %v for JSON", isProtobuf(pb), isProtobuf(js))
			}
			if err := decodePodProtobuf(pb, &got); err != nil {
				t.Fatalf("protobuf: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("protobuf decodes otherwise than JSON (-JSON +protobuf):\n%s", diff)
			}
		})
	}
}

// TestEveryCutOfAProtobufPodFailsOrDecodesTheSame: a protobuf pod cut short at any
// byte fails with an error (never a panic), unless it is cut between the
// envelope's fields that follow the pod, where it decodes to the whole pod: no cut
// gives a pod with fewer fields.
func TestEveryCutOfAProtobufPodFailsOrDecodesTheSame(t *testing.T) {
	pb := encodeProtobuf(t, protoPods()["sidecar-injected"])
	var whole Pod
	if err := decodePodProtobuf(pb, &whole); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for n := len(ProtobufMagic); n < len(pb); n++ {
		var p Pod
		if err := decodePodProtobuf(pb[:n], &p); err != nil {
			failed++
			continue
		}
		if diff := cmp.Diff(whole, p); diff != "" {
			t.Errorf("cut at %d of %d: decoded otherwise (-whole +cut):\n%s", n, len(pb), diff)
		}
	}
	if failed < len(pb)-len(ProtobufMagic)-4 {
		t.Errorf("%d of %d cuts failed; want all but those after the pod (the envelope's two empty strings)", failed, len(pb)-len(ProtobufMagic))
	}
}

// TestBadProtobufIsRefusedNamingTheField: what is not a pod, or not one the
// decoder can read, is an error that names where.
func TestBadProtobufIsRefusedNamingTheField(t *testing.T) {
	status := encodeProtobuf(t, &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Reason: metav1.StatusReasonNotFound})
	// envelope builds an envelope around raw (none when nil), with kind and
	// content encoding.
	envelope := func(kind, encoding string, raw []byte) []byte {
		var b []byte
		str := func(num byte, s []byte) {
			b = append(b, num<<3|wireBytes, byte(len(s)))
			b = append(b, s...)
		}
		typeMeta := append([]byte{1<<3 | wireBytes, 2, 'v', '1', 2<<3 | wireBytes, byte(len(kind))}, kind...)
		str(1, typeMeta)
		if raw != nil {
			str(2, raw)
		}
		if encoding != "" {
			str(3, []byte(encoding))
		}
		return append(append([]byte(nil), ProtobufMagic...), b...)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, `envelope: not Kubernetes' protobuf (it does not start with "k8s\x00")`},
		{"shorter than the magic", ProtobufMagic[:3], `envelope: not Kubernetes' protobuf`},
		{"JSON", []byte(`{"kind":"Pod"}`), `envelope: not Kubernetes' protobuf`},
		{"a Status", status, `envelope: kind "Status", want Pod`},
		{"no kind", ProtobufMagic, `envelope: kind "", want Pod`},
		{"no object", envelope("Pod", "", nil), "envelope: no object"},
		{"compressed", envelope("Pod", "gzip", nil), `content encoding "gzip" is not supported`},
		// metadata (1) as a varint.
		{"metadata not a message", envelope("Pod", "", []byte{1 << 3, 1}), "metadata: wire type 0, want 2"},
		// metadata{name (1) as a varint}.
		{"name not a string", envelope("Pod", "", []byte{1<<3 | wireBytes, 2, 1 << 3, 7}), "metadata.name: wire type 0, want 2"},
		// spec{containers[{ports[{containerPort (3) as a string}]}]}.
		{"port not a number", envelope("Pod", "", []byte{2<<3 | wireBytes, 6, 2<<3 | wireBytes, 4, 6<<3 | wireBytes, 2, 3<<3 | wireBytes, 0}),
			"spec.containers.ports.containerPort: wire type 2, want 0"},
		// spec{containers[{name: length 5, 1 byte}]}.
		{"truncated string", envelope("Pod", "", []byte{2<<3 | wireBytes, 5, 2<<3 | wireBytes, 3, 1<<3 | wireBytes, 5, 'a'}),
			"spec.containers: field 1: truncated length-delimited value"},
		// status{a group (wire type 3)}.
		{"group", envelope("Pod", "", []byte{3<<3 | wireBytes, 1, 1<<3 | 3}), "status: field 1: wire type 3 is not supported"},
		{"field number 0", envelope("Pod", "", []byte{0 | wireVarint, 1}), "Pod: field number 0"},
		// metadata{name: p} under field number 1<<29 (protobuf's highest is 1<<29 - 1).
		{"field number out of range", envelope("Pod", "", append(binary.AppendUvarint(nil, 1<<29<<3|wireBytes), 3, 1<<3|wireBytes, 1, 'p')),
			"Pod: field number 536870912 is out of range"},
		{"varint of 11 bytes", envelope("Pod", "", []byte{9 << 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
			"Pod: field 9: truncated varint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Pod
			err := decodePodProtobuf(tc.data, &p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// TestAProtobufStatusGivesItsReasonAndMessage: an API error in protobuf (a 404's
// Status) gives the reason and message its JSON would.
func TestAProtobufStatusGivesItsReasonAndMessage(t *testing.T) {
	st := &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Message: `pods "web" not found`, Code: 404,
		Details: &metav1.StatusDetails{Name: "web", Kind: "pods"},
	}
	var reason, message string
	if err := decodeStatusErrorProtobuf(encodeProtobuf(t, st), &reason, &message); err != nil {
		t.Fatal(err)
	}
	if reason != "NotFound" || message != `pods "web" not found` {
		t.Errorf("reason %q, message %q; want NotFound, %q", reason, message, st.Message)
	}
}

func FuzzDecodePodProtobuf(f *testing.F) {
	for _, p := range protoPods() {
		f.Add(encodeProtobuf(f, p))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var p Pod
		if decodePodProtobuf(data, &p) != nil {
			return
		}
		// What decodes, decodes the same again.
		var again Pod
		if err := decodePodProtobuf(data, &again); err != nil || !cmp.Equal(p, again) {
			t.Errorf("a second decode differs: %v", err)
		}
	})
}

// asTheAPIMachineryReads is what the pod in raw (a Pod message) is to the plugin
// as the API server would send it in JSON: decoded by the API machinery
// (corev1.Pod's Unmarshal, as the API server reads etcd), written by
// encoding/json, and read by decodePod; false when the API machinery refuses it
// or its JSON cannot carry it (a time past the year 9999). again is the API
// machinery's own encoding of that object, which the API server sends in
// protobuf.
func asTheAPIMachineryReads(t testing.TB, raw []byte) (want Pod, again []byte, ok bool) {
	t.Helper()
	var ref corev1.Pod
	if ref.Unmarshal(raw) != nil {
		return Pod{}, nil, false
	}
	js, err := json.Marshal(&ref)
	if err != nil {
		return Pod{}, nil, false
	}
	if decodePod(js, &want) != nil {
		return Pod{}, nil, false
	}
	if again, err = ref.Marshal(); err != nil {
		t.Fatal(err)
	}
	return want, again, true
}

// podEnvelope is raw (a Pod message) in the envelope the API server sends.
func podEnvelope(t testing.TB, raw []byte) []byte {
	t.Helper()
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: "Pod"}, Raw: raw}
	env, err := unk.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(append([]byte(nil), ProtobufMagic...), env...)
}

// TestTheDeletionTimestampReadsAsTheAPIMachineryReadsIt: a meta/v1 Time's nanos
// are not read (the API machinery drops them, and its JSON has whole seconds),
// the zero time (an empty message, or its seconds) is no deletion timestamp, as
// its JSON null, and a second one replaces the first.
func TestTheDeletionTimestampReadsAsTheAPIMachineryReadsIt(t *testing.T) {
	// meta builds metadata{name: p, namespace: ns, deletionTimestamp: each of ts}.
	meta := func(ts ...[]byte) []byte {
		m := []byte{1<<3 | wireBytes, 1, 'p', 3<<3 | wireBytes, 2, 'n', 's'}
		for _, t := range ts {
			m = append(append(m, 9<<3|wireBytes, byte(len(t))), t...)
		}
		return append([]byte{1<<3 | wireBytes, byte(len(m))}, m...)
	}
	// stamp is a Time of seconds and nanos (0: not given).
	stamp := func(seconds int64, nanos int32) []byte {
		var b []byte
		if seconds != 0 {
			b = binary.AppendUvarint(append(b, 1<<3), uint64(seconds))
		}
		if nanos != 0 {
			b = binary.AppendUvarint(append(b, 2<<3), uint64(int64(nanos)))
		}
		return b
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		want string // RFC 3339, or "" for none
	}{
		{"seconds", meta(stamp(1795851005, 0)), "2026-11-28T07:30:05Z"},
		{"nanos are dropped", meta(stamp(1795851005, 999999999)), "2026-11-28T07:30:05Z"},
		{"negative nanos are dropped", meta(stamp(1795851005, -1)), "2026-11-28T07:30:05Z"},
		{"the epoch", meta(stamp(0, 1)), "1970-01-01T00:00:00Z"},
		{"an empty message", meta(stamp(0, 0)), ""},
		{"the zero time's seconds", meta(stamp(-62135596800, 0)), ""},
		{"given twice", meta(stamp(1795851005, 0), stamp(1795851006, 0)), "2026-11-28T07:30:06Z"},
		{"given twice, the second empty", meta(stamp(1795851005, 0), stamp(0, 0)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _, ok := asTheAPIMachineryReads(t, tc.raw)
			if !ok {
				t.Fatal("the API machinery refuses it")
			}
			var got Pod
			if err := decodePodProtobuf(podEnvelope(t, tc.raw), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("decodes otherwise than the API machinery's JSON (-JSON +protobuf):\n%s", diff)
			}
			at := ""
			if got.Metadata.DeletionTimestamp != nil {
				at = got.Metadata.DeletionTimestamp.Format(time.RFC3339)
			}
			if at != tc.want {
				t.Errorf("deletionTimestamp %q, want %q", at, tc.want)
			}
		})
	}
}

// FuzzProtobufPodDecodesAsTheAPIMachinery: a pod's protobuf that the API
// machinery decodes, decodes here to what the API server's JSON of that object
// decodes to (asTheAPIMachineryReads): as given, when this decoder takes it (it
// may refuse what the API machinery takes: a group, a varint over 64 bits), and
// always once the API machinery has encoded the object again, which is what the
// API server sends. Fields given twice merge as protobuf merges them, maps keep a
// key's last value, and strings that are not UTF-8 read as JSON has them.
func FuzzProtobufPodDecodesAsTheAPIMachinery(f *testing.F) {
	for _, p := range protoPods() {
		raw, err := p.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
		f.Add(append(raw, raw...)) // every field twice
	}
	// metadata{name: p} under field number 1<<32 | 1, which the API machinery
	// reads as 1 (it keeps a field number's low 32 bits).
	f.Add(append(binary.AppendUvarint(nil, (1<<32|1)<<3|wireBytes), 3, 1<<3|wireBytes, 1, 'p'))
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, again, ok := asTheAPIMachineryReads(t, raw)
		if !ok {
			return
		}
		for _, tc := range []struct {
			name string
			raw  []byte
		}{{"as given", raw}, {"encoded again", again}} {
			var got Pod
			if err := decodePodProtobuf(podEnvelope(t, tc.raw), &got); err != nil {
				if tc.name == "as given" {
					continue
				}
				t.Fatalf("%s: %v", tc.name, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: decodes otherwise than the API machinery's JSON (-JSON +protobuf):\n%s", tc.name, diff)
			}
		}
	})
}

// TestGetAsksForAPodInProtobufAndTheRestInJSON: Get asks for a pod in protobuf
// with JSON accepted and reads either answer (Encoding says which); it asks for
// anything else in JSON alone and does not read protobuf into it; an API error's
// reason and message are read in either encoding.
func TestGetAsksForAPodInProtobufAndTheRestInJSON(t *testing.T) {
	pod := protoPods()["sidecar-injected"]
	podJSON, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	podProto := encodeProtobuf(t, pod)
	notFound := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Message: `pods "web" not found`, Code: 404}
	notFoundJSON, err := json.Marshal(notFound)
	if err != nil {
		t.Fatal(err)
	}
	var accept string
	var code int
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		w.WriteHeader(code)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(&Kubeconfig{Server: srv.URL}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var want Pod
	if err := decodePod(podJSON, &want); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		out        any
		code       int
		body       []byte
		wantAccept string
		want       any    // the object read
		encoding   string // Encoding after it
		wantErr    []string
	}{
		{"a pod in protobuf", &Pod{}, 200, podProto, ProtobufContentType + ", application/json", &want, EncodingProtobuf, nil},
		{"a pod in JSON", &Pod{}, 200, podJSON, ProtobufContentType + ", application/json", &want, EncodingJSON, nil},
		{"a missing pod, its Status in protobuf", &Pod{}, 404, encodeProtobuf(t, notFound), ProtobufContentType + ", application/json", nil, "",
			[]string{"not found", `API server answered 404 NotFound: pods "web" not found`}},
		{"a missing pod, its Status in JSON", &Pod{}, 404, notFoundJSON, ProtobufContentType + ", application/json", nil, "",
			[]string{"not found", `API server answered 404 NotFound: pods "web" not found`}},
		{"a namespace in JSON", &Namespace{}, 200, []byte(`{"metadata":{"name":"ns"}}`), "application/json",
			&Namespace{Metadata: ObjectMeta{Name: "ns"}}, EncodingJSON, nil},
		{"a namespace in protobuf, not asked for", &Namespace{}, 200, encodeProtobuf(t, &corev1.Namespace{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: "ns"}}),
			"application/json", nil, EncodingJSON, []string{"answer does not decode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body = tc.code, tc.body
			c.encoding = ""
			err := c.Get(t.Context(), "/api/v1/namespaces/ns/pods/web", tc.out)
			if accept != tc.wantAccept {
				t.Errorf("Accept %q, want %q", accept, tc.wantAccept)
			}
			if c.Encoding() != tc.encoding {
				t.Errorf("Encoding() %q, want %q", c.Encoding(), tc.encoding)
			}
			if tc.wantErr != nil {
				wanterr.Mentions(t, err, tc.wantErr...)
				if tc.code == 404 && !errors.Is(err, ErrNotFound) {
					t.Errorf("%v is not ErrNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, tc.out); diff != "" {
				t.Errorf("read (-want +got):\n%s", diff)
			}
		})
	}
}
