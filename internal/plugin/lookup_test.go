package plugin

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// TestPodLookupIsBoundedAndSaysWhatHappened: against API servers that misbehave in
// each way seen in the field, the lookup ends within its one bound (retries x
// interval) and its error says what happened. The servers are httptest stand-ins:
// no real API server can be made to hang or answer garbage on purpose.
func TestPodLookupIsBoundedAndSaysWhatHappened(t *testing.T) {
	const podJSON = `{"metadata":{"name":"web","namespace":"app","uid":"u1"}}`
	budget := PodLookup{Retries: 3, Interval: 300 * time.Millisecond} // bound 5s: one request's timeout
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		tls     bool
		trustCA bool
		want    []string
	}{
		{"hangs", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, true, true,
			[]string{"lookup failed after 1 tries", "the API server did not answer in time"}},
		{"answers slower than the bound", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(8 * time.Second):
				io.WriteString(w, podJSON)
			}
		}, true, true, []string{"the API server did not answer in time"}},
		{"forbidden", status(403, "Forbidden", `pods "web" is forbidden: User "x" cannot get resource "pods"`), true, true,
			[]string{"lookup failed after 3 tries", "the API server refused with HTTP 403", "cannot get resource"}},
		{"not found", status(404, "NotFound", `pods "web" not found`), true, true,
			[]string{"lookup failed after 3 tries", "the pod does not exist"}},
		{"server error", status(500, "InternalError", "etcd timeout"), true, true,
			[]string{"the API server refused with HTTP 500", "etcd timeout"}},
		{"garbage", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>proxy error</html>") }, true, true,
			[]string{"the API server's answer is not a pod", "24-byte answer does not decode"}},
		{"unknown CA", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, podJSON) }, true, false,
			[]string{"the API server's certificate is not trusted"}},
		{"refused connections", nil, false, false,
			[]string{"lookup failed after 3 tries", "the API server could not be reached", "connection refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server := "https://127.0.0.1:1" // nothing listens on port 1
			var caPEM []byte
			if tc.handler != nil {
				srv := httptest.NewTLSServer(tc.handler)
				t.Cleanup(srv.Close)
				server = srv.URL
				if tc.trustCA {
					caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
				}
			}
			cfg := lookupConfig(t, server, caPEM)
			checkBoundedFailure(t, budget, append(tc.want, "pod app/web", "(bound 5s)"), func(log *pluginlog.Logger) error {
				_, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app"}, log, budget)
				return err
			})
		})
	}
}

// checkBoundedFailure runs one of the plugin's API lookups under budget: it must
// fail within the budget's bound (+0.5s) with an error saying each of want.
func checkBoundedFailure(t *testing.T, budget PodLookup, want []string, lookup func(log *pluginlog.Logger) error) {
	t.Helper()
	log := pluginlog.New(io.Discard, pluginlog.Options{})
	defer log.Close()
	start := time.Now()
	err := lookup(log)
	took := time.Since(start)
	if err == nil {
		t.Fatal("lookup succeeded")
	}
	if limit := budget.Bound() + 500*time.Millisecond; took > limit {
		t.Errorf("lookup took %s, more than its bound %s (+0.5s)", took, budget.Bound())
	}
	wanterr.Mentions(t, err, want...)
}

func status(code int, reason, message string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","status":"Failure","reason":%q,"message":%q,"code":%d}`, reason, message, code)
	}
}

// lookupConfig is a plugin config whose kubeconfig points at server, trusting caPEM
// (none: the system roots).
func lookupConfig(t *testing.T, server string, caPEM []byte) *Config {
	t.Helper()
	dir := shortdir.New(t) // its sockets must fit the 108 bytes of a unix socket path
	ca := ""
	if caPEM != nil {
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		ca = "    certificate-authority: " + filepath.Join(dir, "ca.crt") + "\n"
	}
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + server + "\n" + ca +
		"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Config{Kubeconfig: path, AgentRunDir: dir}
}

// TestLookupFailureNamesAPodOfTheSameName: an API server answering with another pod
// (recreated under the same name) is said to be so, not mistaken for an outage.
func TestLookupFailureNamesAPodOfTheSameName(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"metadata":{"name":"web","namespace":"app","uid":"new"}}`)
	}))
	defer srv.Close()
	cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	log := pluginlog.New(io.Discard, pluginlog.Options{})
	defer log.Close()
	_, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app", UID: "old"}, log, PodLookup{Retries: 2, Interval: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "the API server has another pod of that name") || !strings.Contains(err.Error(), "pod recreated") {
		t.Fatalf("lookup of a recreated pod = %v, want it named as another pod", err)
	}
}

// TestNamespaceLookupIsBoundedAndSaysWhatHappened: the namespace's lookup has the
// pod lookup's bound and classification, and its error names the pod and the
// namespace.
func TestNamespaceLookupIsBoundedAndSaysWhatHappened(t *testing.T) {
	budget := PodLookup{Retries: 3, Interval: 300 * time.Millisecond}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    []string
	}{
		{"hangs", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			[]string{"lookup failed after 1 tries", "the API server did not answer in time"}},
		{"forbidden", status(403, "Forbidden", `namespaces "app" is forbidden: User "x" cannot get resource "namespaces"`),
			[]string{"lookup failed after 3 tries", "the API server refused with HTTP 403", `cannot get resource "namespaces"`}},
		{"not found", status(404, "NotFound", `namespaces "app" not found`),
			[]string{"the namespace does not exist"}},
		{"garbage", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>proxy error</html>") },
			[]string{"the API server's answer is not a namespace"}},
		{"another object", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"metadata":{"name":"web","namespace":"app"}}`)
		},
			[]string{"the API server's answer is not a namespace", `asked for "app", the answer is "web"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewTLSServer(tc.handler)
			t.Cleanup(srv.Close)
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			checkBoundedFailure(t, budget, append(tc.want, "pod app/web: namespace app: lookup failed", "(bound 5s)"), func(log *pluginlog.Logger) error {
				_, err := (&Plugin{}).lookupNamespace(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app"}, log, budget)
				return err
			})
		})
	}
}

// TestDecideLooksUpTheNamespaceOnlyWhenItDecides: against an API server holding the
// pod and its namespace labelled ambient, a sidecar-less pod is refused after one GET
// of the namespace; a sidecar pod, or one labelled dataplane-mode=none, costs no
// namespace GET; a failed namespace GET fails the decision (closed), naming it.
func TestDecideLooksUpTheNamespaceOnlyWhenItDecides(t *testing.T) {
	sidecarPod := `{"metadata":{"name":"web","namespace":"app"},"spec":{"containers":[{"name":"app"},{"name":"istio-proxy"}]},` +
		`"status":{"podIP":"10.0.0.9"}}`
	plainPod := func(labels string) string {
		return `{"metadata":{"name":"web","namespace":"app","labels":{` + labels + `}},"spec":{"containers":[{"name":"app"}]}}`
	}
	ambientNS := `{"metadata":{"name":"app","labels":{"istio.io/dataplane-mode":"ambient"}}}`
	for _, tc := range []struct {
		name, pod string
		ns        http.HandlerFunc
		wantNSGet int
		wantRule  Rule
		wantErr   string
	}{
		{"no sidecar in an ambient namespace", plainPod(""), nil, 1, RuleAmbient, "is in namespace app, which has label istio.io/dataplane-mode=ambient"},
		{"no sidecar, labelled none", plainPod(`"istio.io/dataplane-mode":"none"`), nil, 0, RuleNoIstioProxy, ""},
		{"sidecar pod", strings.Replace(sidecarPod, `"metadata":{`, `"metadata":{"annotations":{"sidecar.istio.io/status":"{}"},`, 1), nil, 0, RuleSidecar, ""},
		{"namespace GET forbidden", plainPod(""), status(403, "Forbidden", `cannot get resource "namespaces"`), 2, "",
			"pod app/web: namespace app: lookup failed after 2 tries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nsGets atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/api/v1/namespaces/app/pods/web":
					io.WriteString(w, tc.pod)
				case "/api/v1/namespaces/app":
					nsGets.Add(1)
					if tc.ns != nil {
						tc.ns(w, r)
						return
					}
					io.WriteString(w, ambientNS)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			podArgs, err := ParsePodArgs("K8S_POD_NAMESPACE=app;K8S_POD_NAME=web")
			if err != nil {
				t.Fatal(err)
			}
			pp, err := (&Plugin{}).decide(context.Background(), cfg, podArgs, "/var/run/netns/none", log, PodLookup{Retries: 2, Interval: 10 * time.Millisecond},
				[]netip.Addr{netip.MustParseAddr("10.0.0.9")})
			d := pp.Decision
			if got := int(nsGets.Load()); got != tc.wantNSGet {
				t.Errorf("namespace GETs = %d, want %d", got, tc.wantNSGet)
			}
			if d.Rule != tc.wantRule {
				t.Errorf("rule = %q, want %q (%s)", d.Rule, tc.wantRule, d.Reason)
			}
			if tc.wantErr == "" && tc.wantRule != RuleAmbient {
				if err != nil {
					t.Errorf("decide: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("decide error = %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}

// TestLookupReadsTheAPIServersCacheFirst: the first GET asks for the API server's
// watch cache (resourceVersion=0), and one answer from it is enough. An answer that
// is not the pod (not found there yet, or an older pod of the same name) is asked
// again at once from etcd (no resourceVersion), with no retry interval waited and
// no try of the budget spent.
func TestLookupReadsTheAPIServersCacheFirst(t *testing.T) {
	const pod = `{"metadata":{"name":"web","namespace":"app","uid":"u1"}}`
	for _, tc := range []struct {
		name   string
		cached func(w http.ResponseWriter) // the answer to a resourceVersion=0 GET
		want   []string                    // the GETs' queries, in order
	}{
		{"cache answers", func(w http.ResponseWriter) { io.WriteString(w, pod) }, []string{"resourceVersion=0"}},
		{"cache has not seen the pod", func(w http.ResponseWriter) { status(404, "NotFound", `pods "web" not found`)(w, nil) },
			[]string{"resourceVersion=0", ""}},
		{"cache has the pod's predecessor", func(w http.ResponseWriter) {
			io.WriteString(w, `{"metadata":{"name":"web","namespace":"app","uid":"u0"}}`)
		}, []string{"resourceVersion=0", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				got = append(got, r.URL.RawQuery)
				mu.Unlock()
				if r.URL.Query().Get("resourceVersion") == "0" {
					tc.cached(w)
					return
				}
				io.WriteString(w, pod)
			}))
			defer srv.Close()
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			// One try and a long interval: a second GET within the budget, and no
			// wait, only if the cache read is not counted and not waited after.
			start := time.Now()
			p, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app", UID: "u1"}, log, PodLookup{Retries: 1, Interval: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("lookup took %s: it waited a retry interval", took)
			}
			if p.Metadata.UID != "u1" {
				t.Errorf("looked up uid %q, want u1", p.Metadata.UID)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GET queries (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLookupReadsTheAgentsPodFileFirst: a pod file of the sandbox's pod (name and
// uid) answers without any request, while a live agent keeps the files (their
// lock); a file of the pod's predecessor (another uid), a file that does not
// decode, one of another format version (an agent of another build) or of none
// (one before versions), a file no agent keeps (a killed agent's), or no file at
// all goes on to the API server (here a stand-in counting its GETs), which
// answers.
func TestLookupReadsTheAgentsPodFileFirst(t *testing.T) {
	const pod = `{"metadata":{"name":"web","namespace":"app","uid":"u1"},"spec":{"nodeName":"from-api"}}`
	const fromFile = `"metadata":{"name":"web","namespace":"app","uid":"u1"},"spec":{"nodeName":"from-file"}}`
	v1 := `{"podFileVersion":1,`
	for _, tc := range []struct {
		name     string
		file     string // "": none
		notKept  bool
		wantGETs int
		wantNode string
	}{
		{"the pod's file", v1 + fromFile, false, 0, "from-file"},
		{"its predecessor's file", v1 + `"metadata":{"name":"web","namespace":"app","uid":"u0"},"spec":{"nodeName":"from-file"}}`, false, 1, "from-api"},
		{"a file that does not decode", v1 + `"metadata":`, false, 1, "from-api"},
		{"a file of format version 2", `{"podFileVersion":2,` + fromFile, false, 1, "from-api"},
		{"a file of no format version", `{` + fromFile, false, 1, "from-api"},
		{"the pod's file, kept by no agent", v1 + fromFile, true, 1, "from-api"},
		{"no file", "", false, 1, "from-api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gets atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gets.Add(1)
				io.WriteString(w, pod)
			}))
			defer srv.Close()
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			dir := filepath.Join(cfg.AgentRunDir, kube.AgentPodFilesDir)
			if !tc.notKept {
				keepAgentPodFiles(t, dir)
			}
			if tc.file != "" {
				path, _ := kube.AgentPodFile(dir, "app", "web")
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			p, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app", UID: "u1"}, log, PodLookup{Retries: 1, Interval: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if p.Spec.NodeName != tc.wantNode || int(gets.Load()) != tc.wantGETs {
				t.Errorf("looked up the pod of %q with %d GETs, want %q with %d", p.Spec.NodeName, gets.Load(), tc.wantNode, tc.wantGETs)
			}
		})
	}
}

func TestAgentPodFileNames(t *testing.T) {
	for _, tc := range []struct {
		ns, name string
		ok       bool
	}{
		{"app", "web-5d8f7-abcde", true},
		{"app", "web.v2", true},
		{"app", "../../etc/passwd", false},
		{"app", ".hidden", false},
		{"a_b", "web", false},
		{"", "web", false},
	} {
		path, ok := kube.AgentPodFile("/run/x/pods", tc.ns, tc.name)
		if ok != tc.ok || ok && filepath.Dir(path) != "/run/x/pods" {
			t.Errorf("AgentPodFile(%q, %q) = %q, %v; want ok %v, inside the directory", tc.ns, tc.name, path, ok, tc.ok)
		}
	}
}

// TestAKubeconfigThePluginCannotUseFailsAtOnce: a kubeconfig whose credential
// this client cannot use (or whose names lead nowhere) fails STATUS and every
// ADD's lookup at once, naming the key, instead of sending anonymous requests
// that the API server refuses until the lookup's bound runs out.
func TestAKubeconfigThePluginCannotUseFailsAtOnce(t *testing.T) {
	budget := PodLookup{Retries: 5, Interval: time.Second}
	for _, tc := range []struct {
		name, old, new string
		want           []string
	}{
		{"an exec credential plugin", "    token: t\n",
			"    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\n",
			[]string{`user "u": exec (command "aws"): not supported`}},
		{"an auth provider", "    token: t\n", "    auth-provider:\n      name: oidc\n", []string{`user "u": auth-provider (name "oidc")`}},
		{"a context's user not in users", "    user: u\n", "    user: typo\n", []string{`context "c": user "typo": no user of that name`}},
		{"a current-context naming no context", "current-context: c\n", "current-context: typo\n", []string{`current-context "typo": no context of that name`}},
		// kubectl refuses it too: the CA would be left unchecked, and the pod
		// specs that decide every capture would come from any server.
		{"insecure-skip-tls-verify beside a CA", "    certificate-authority: ", "    insecure-skip-tls-verify: true\n    certificate-authority: ",
			[]string{`cluster "c": insecure-skip-tls-verify beside certificate-authority`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gets atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gets.Add(1)
				status(401, "Unauthorized", "Unauthorized")(w, r)
			}))
			t.Cleanup(srv.Close)
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			kc, err := os.ReadFile(cfg.Kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(kc), tc.old) {
				t.Fatalf("the test's kubeconfig holds no %q", tc.old)
			}
			// Where STATUS reads it: the run directory's kubeconfig.
			cfg.Kubeconfig = filepath.Join(cfg.AgentRunDir, KubeconfigName)
			if err := os.WriteFile(cfg.Kubeconfig, []byte(strings.Replace(string(kc), tc.old, tc.new, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			start := time.Now()
			_, err = (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app"}, log, budget)
			if took := time.Since(start); took > time.Second {
				t.Errorf("the lookup took %s (its bound %s), want a failure at once", took, budget.Bound())
			}
			wanterr.Mentions(t, err, append([]string{"pod app/web", cfg.Kubeconfig}, tc.want...)...)
			if n := gets.Load(); n != 0 {
				t.Errorf("the API server got %d requests, want none", n)
			}
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"istio-cni","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q}`, cfg.AgentRunDir)
			err = (&Plugin{Stderr: io.Discard}).Status(&cnicmd.CmdArgs{StdinData: []byte(conf)})
			wanterr.Mentions(t, err, append([]string{"cannot look pods up", cfg.Kubeconfig}, tc.want...)...)
		})
	}
}

// TestALookupTakesTheCredentialsTheAgentRewroteMeanwhile: a lookup refused because
// its kubeconfig's credentials are stale (a token the API server refuses with
// HTTP 401: expired while no agent ran, or an agent's own token whose pod was
// deleted; a CA the API server's certificate no longer chains to) reads the
// kubeconfig again before its next try: the agent rewrites it with a fresh token
// or the rotated CA, and the ADD succeeds then. It kept the credentials it read at
// its start for the whole bound (30 s by default), refused at every try, although
// the agent had written working ones a moment after its first.
func TestALookupTakesTheCredentialsTheAgentRewroteMeanwhile(t *testing.T) {
	const pod = `{"metadata":{"name":"web","namespace":"app","uid":"u1"}}`
	otherCA, err := controlplane.NewCA("a CA rotated out")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name              string
		oldToken, oldCAOf string // the kubeconfig's credentials at the lookup's start
	}{
		{"token refused with 401, renewed by the agent", "expired", "server"},
		{"CA rotated, the agent writes the new one", "fresh", "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rewrite sync.Once
			var cfg *Config
			var kubeconfig func(token string, caPEM []byte)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer fresh" {
					status(401, "Unauthorized", "Unauthorized")(w, r)
					return
				}
				io.WriteString(w, pod)
			}))
			caOf := func(s *httptest.Server) []byte {
				return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
			}
			// The agent rewrites the kubeconfig as the lookup's first connection
			// comes: after the plugin has read it.
			srv.Config.ConnState = func(net.Conn, http.ConnState) {
				rewrite.Do(func() { kubeconfig("fresh", caOf(srv)) })
			}
			srv.StartTLS()
			defer srv.Close()
			cfg = lookupConfig(t, srv.URL, nil)
			kubeconfig = func(token string, caPEM []byte) {
				kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + srv.URL + "\n" +
					"    certificate-authority-data: " + base64.StdEncoding.EncodeToString(caPEM) + "\n" +
					"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: " + token + "\n"
				tmp := cfg.Kubeconfig + ".tmp"
				if err := os.WriteFile(tmp, []byte(kc), 0o600); err != nil {
					t.Error(err)
				}
				if err := os.Rename(tmp, cfg.Kubeconfig); err != nil {
					t.Error(err)
				}
			}
			old := caOf(srv)
			if tc.oldCAOf == "other" {
				old = otherCA.CertPEM
			}
			kubeconfig(tc.oldToken, old)
			log := pluginlog.New(io.Discard, pluginlog.Options{})
			defer log.Close()
			budget := PodLookup{Retries: 5, Interval: 200 * time.Millisecond}
			p, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app", UID: "u1"}, log, budget)
			if err != nil {
				t.Fatalf("the lookup kept the credentials the agent replaced: %v", err)
			}
			if p.Metadata.UID != "u1" {
				t.Errorf("looked up uid %q, want u1", p.Metadata.UID)
			}
		})
	}
}

// TestALookupRefusedWithHTTP401NamesTheKubeconfigAndTheTokensExpiry: the API
// server says only "Unauthorized" of a token it refuses, so the ADD's error names
// the kubeconfig whose token was refused and, when that token's exp claim is past
// by the node's clock, when it expired: what a person needs to see that the
// agent has not renewed it. The error said "the API server refused with HTTP 401:
// Unauthorized", naming neither.
func TestALookupRefusedWithHTTP401NamesTheKubeconfigAndTheTokensExpiry(t *testing.T) {
	expired := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	jwt := func(exp time.Time) string {
		payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d,"iat":%d,"sub":"system:serviceaccount:istio-system:istio-cni-plugin"}`,
			exp.Unix(), exp.Add(-24*time.Hour).Unix()))
		return "eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln"
	}
	for _, tc := range []struct {
		name  string
		token string
		want  []string
		not   string
	}{
		{"expired token", jwt(expired), []string{"HTTP 401", "expired at 2026-03-04T05:06:07Z"}, ""},
		{"token not expired by the node's clock", jwt(time.Now().Add(time.Hour)), []string{"HTTP 401"}, "expired"},
		{"opaque token", "t", []string{"HTTP 401"}, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(status(401, "Unauthorized", "Unauthorized"))
			defer srv.Close()
			cfg := lookupConfig(t, srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			kc, err := os.ReadFile(cfg.Kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cfg.Kubeconfig, []byte(strings.Replace(string(kc), "    token: t\n", "    token: "+tc.token+"\n", 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			budget := PodLookup{Retries: 2, Interval: 100 * time.Millisecond}
			checkBoundedFailure(t, budget, append([]string{"pod app/web", cfg.Kubeconfig}, tc.want...), func(log *pluginlog.Logger) error {
				_, err := (&Plugin{}).lookup(context.Background(), cfg, PodArgs{Name: "web", Namespace: "app"}, log, budget)
				if err != nil && tc.not != "" && strings.Contains(err.Error(), tc.not) {
					t.Errorf("the error says %q of a token the node's clock does not see expired:\n%v", tc.not, err)
				}
				return err
			})
		})
	}
}
