package kube

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// podPaths are every field decodePod reads, as JSON paths ("[]" an array's
// element), in the case the struct tags give.
var podPaths = []string{
	"metadata", "metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
	"metadata.deletionTimestamp", "spec", "spec.nodeName", "spec.securityContext", "spec.securityContext.runAsUser",
	"spec.securityContext.runAsGroup", "status", "status.phase", "status.podIP", "status.podIPs", "status.podIPs[].ip",
}

// containerPaths are a container's, under spec.containers[] and
// spec.initContainers[].
var containerPaths = []string{
	"", "name", "image", "args", "args[]", "env", "env[]", "env[].name", "env[].value", "ports", "ports[]",
	"ports[].name", "ports[].containerPort", "ports[].protocol", "securityContext", "securityContext.runAsUser",
	"securityContext.runAsGroup", "restartPolicy",
}

var podSampleValues = []string{
	`null`, `true`, `0`, `-1`, `1.5`, `1e3`, `2147483647`, `2147483648`, `9223372036854775808`, `""`, `"x"`,
	`"2025-01-02T03:04:05Z"`, `"2025-13-02T03:04:05Z"`, `"\u00e9"`, `[]`, `[null]`, `["a"]`, `[1]`, `[{}]`,
	`{}`, `{"a":"b"}`, `{"a":1}`, `{"a":null}`,
}

// nestPath puts value at path ("a.b[].c") in a document.
func nestPath(path, value string) string {
	if path == "" {
		return value
	}
	head, rest, _ := strings.Cut(path, ".")
	inner := nestPath(rest, value)
	if name, ok := strings.CutSuffix(head, "[]"); ok {
		if name == "" {
			return "[" + inner + "]"
		}
		return fmt.Sprintf(`{%q:[%s]}`, name, inner)
	}
	return fmt.Sprintf(`{%q:%s}`, head, inner)
}

// sameDecode fails t unless decode and encoding/json decode doc to the same T, or
// fail with the same error (a type error compared by its field, value and type).
func sameDecode[T any](t *testing.T, doc []byte, decode func([]byte, *T) error) {
	t.Helper()
	var want, got T
	wantErr := json.Unmarshal(doc, &want)
	gotErr := decode(doc, &got)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: error %v, encoding/json's %v", doc, gotErr, wantErr)
	}
	if wantErr != nil {
		w, g := fmt.Sprintf("%v", wantErr), fmt.Sprintf("%v", gotErr)
		var wt, gt *json.UnmarshalTypeError
		if asType(wantErr, &wt) && asType(gotErr, &gt) {
			w = fmt.Sprintf("%s: %s into %s", wt.Field, wt.Value, wt.Type)
			g = fmt.Sprintf("%s: %s into %s", gt.Field, gt.Value, gt.Type)
		}
		if w != g {
			t.Fatalf("%s: error\n got %s\nwant %s", doc, g, w)
		}
		return
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s: decodes differently (-encoding/json +ours):\n%s", doc, diff)
	}
}

func samePod(t *testing.T, doc []byte) { t.Helper(); sameDecode(t, doc, decodePod) }

func asType(err error, to **json.UnmarshalTypeError) bool {
	te, ok := err.(*json.UnmarshalTypeError)
	*to = te
	return ok
}

// pathDocs are the documents a decoder's tests start from: every path with every
// sample value, in its own case and upper case, and the extras.
func pathDocs(paths []string, extras ...string) [][]byte {
	var docs [][]byte
	for _, p := range paths {
		for _, v := range podSampleValues {
			docs = append(docs, []byte(nestPath(p, v)), []byte(nestPath(strings.ToUpper(p), v)))
		}
	}
	for _, extra := range extras {
		docs = append(docs, []byte(extra))
	}
	return docs
}

func podDocs() [][]byte {
	paths := append([]string(nil), podPaths...)
	for _, c := range containerPaths {
		for _, under := range []string{"spec.containers[]", "spec.initContainers[]"} {
			paths = append(paths, strings.TrimSuffix(under+"."+c, "."))
		}
	}
	return pathDocs(paths,
		`null`, `[]`, `"pod"`, `{}`, apiPod,
		`{"metadata":{"name":"a","NAME":"b","labels":{"x":"1"},"labels":{"y":"2"}}}`,
		`{"spec":{"containers":[{"name":"a","image":"i"},{"name":"b"}],"containers":[{"name":"c"}]}}`,
		`{"spec":{"containers":[{"name":"a","args":["x","y"]}],"containers":[{"args":[null]}],"containers":[{},{}]}}`,
		`{"spec":{"containers":[{"ports":[{"containerPort":80}]}],"containers":[]}}`,
		`{"spec":{"securityContext":{"runAsUser":1},"securityContext":{"runAsGroup":2}}}`,
		`{"spec":{"containers":[{"securityContext":{"runAsUser":1}}],"containers":[{"securityContext":null}]}}`,
		`{"metadata":{"deletionTimestamp":"x","name":5}}`, `{"metadata":{"name":5,"deletionTimestamp":1}}`,
		`{"metadata":{"deletionTimestamp":"2025-01-02T03:04:05Z","deletionTimestamp":null}}`,
		`{"status":{"podIPs":[{"ip":"a"},{"ip":"b"}],"podIPs":[{"IP":"c"}]}}`,
		`{"metadata":{"name":"x"}`, `{"metadata":}`,
	)
}

func TestDecodePodAgreesWithEncodingJSON(t *testing.T) {
	for _, doc := range podDocs() {
		samePod(t, doc)
	}
}

func FuzzDecodePodAgreesWithEncodingJSON(f *testing.F) {
	for _, doc := range podDocs() {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) { samePod(t, doc) })
}

var kubeconfigPaths = []string{
	"current-context", "clusters", "clusters[]", "clusters[].name", "clusters[].cluster", "clusters[].cluster.server",
	"clusters[].cluster.certificate-authority", "clusters[].cluster.certificate-authority-data",
	"clusters[].cluster.insecure-skip-tls-verify", "contexts", "contexts[]", "contexts[].name", "contexts[].context",
	"contexts[].context.cluster", "contexts[].context.user", "users", "users[]", "users[].name", "users[].user",
	"users[].user.token", "users[].user.tokenFile", "users[].user.client-certificate",
	"users[].user.client-certificate-data", "users[].user.client-key", "users[].user.client-key-data",
	"clusters[].cluster.tls-server-name", "clusters[].cluster.proxy-url", "users[].user.username",
	"users[].user.password", "users[].user.exec", "users[].user.auth-provider", "users[].user.as",
	"users[].user.as-uid", "users[].user.as-groups", "users[].user.as-user-extra",
}

func sameKubeconfig(t *testing.T, doc []byte) { t.Helper(); sameDecode(t, doc, decodeKubeconfig) }

func kubeconfigDocs() [][]byte {
	return pathDocs(kubeconfigPaths,
		`{"current-context":"a","contexts":[{"name":"a","context":{"cluster":"c","user":"u"}}],`+
			`"clusters":[{"name":"c","cluster":{"server":"https://x","certificate-authority-data":"QQ==","insecure-skip-tls-verify":false}}],`+
			`"users":[{"name":"u","user":{"token":"t","tokenFile":"/f","client-certificate-data":"QQ==","client-key-data":"QQ=="}}]}`,
		`{"clusters":[{"name":"a","cluster":{"server":"s"}}],"clusters":[{"cluster":{"insecure-skip-tls-verify":true}}]}`,
		`{"users":[{"user":{"token":"a"}},{"name":"b"}],"users":[{"name":"c"}]}`,
		`{"clusters":[{"cluster":"x","name":5}]}`, `{"users":[{"name":5,"user":[]}]}`,
		`{"users":[{"user":{"exec":{"command":"aws"},"Exec":null}},{"user":{"auth-provider":{"name":"gcp"},"auth-provider":"x"}}]}`,
		`{"users":[{"user":{"exec":{"command":"a"}}}],"users":[{"user":{"exec":[1, 2 ]}}]}`,
	)
}

func TestDecodeKubeconfigAgreesWithEncodingJSON(t *testing.T) {
	for _, doc := range kubeconfigDocs() {
		sameKubeconfig(t, doc)
	}
}

func FuzzDecodeKubeconfigAgreesWithEncodingJSON(f *testing.F) {
	for _, doc := range kubeconfigDocs() {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) { sameKubeconfig(t, doc) })
}
