package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// The bounds of the outage tests below: each outage (up to 50 s) writes about 10
// log lines (a failure is logged when it starts and when its error changes, not at
// each retry), and the goroutines after one are those of before, give or take
// connections and timers.
const (
	maxOutageLogLines  = 30
	maxGoroutineGrowth = 20
)

// outageCheck watches one node's agent through API server outages.
type outageCheck struct {
	t *testing.T
	n *node
	p *agentProc
	// What the agent installed before the outages, which none may change.
	conf, bin      map[string]fileState
	kubeconfig     string
	baseGoroutines float64
}

// newOutageCheck notes what p installed on n and its goroutines, once it leads the
// taint and its pod cache is synced.
func newOutageCheck(t *testing.T, n *node, p *agentProc) *outageCheck {
	t.Helper()
	o := &outageCheck{t: t, n: n, p: p}
	o.recovered("at start")
	o.conf, o.bin = snapshot(t, n.confDir), snapshot(t, n.binDir)
	o.kubeconfig = readFileString(t, n.kubeconfigPath())
	o.baseGoroutines = p.metric(t, "go_goroutines")
	t.Logf("at start: %s", o.figures())
	return o
}

func (o *outageCheck) figures() string {
	return fmt.Sprintf("%v goroutines, %.1f MiB heap", o.p.metric(o.t, "go_goroutines"), o.p.metric(o.t, "go_memstats_heap_alloc_bytes")/(1<<20))
}

// untouched checks that the CNI config, the binaries and the plugin's kubeconfig
// are as before the outages.
func (o *outageCheck) untouched(when string) {
	t := o.t
	t.Helper()
	if d := cmp.Diff(o.conf, snapshot(t, o.n.confDir), cmp.AllowUnexported(fileState{})); d != "" {
		t.Errorf("%s: the CNI config dir changed (-before +now):\n%s", when, d)
	}
	if d := cmp.Diff(o.bin, snapshot(t, o.n.binDir), cmp.AllowUnexported(fileState{})); d != "" {
		t.Errorf("%s: the CNI bin dir changed (-before +now):\n%s", when, d)
	}
	if got := readFileString(t, o.n.kubeconfigPath()); got != o.kubeconfig {
		t.Errorf("%s: the plugin's kubeconfig changed", when)
	}
}

// outage runs for d, checking every half second that nothing of the install
// changes and that /readyz answers wantReady; the log it writes is bounded.
func (o *outageCheck) outage(what string, d time.Duration, wantReady int) {
	t := o.t
	t.Helper()
	lines := func() int { return strings.Count(o.p.stderr.String(), "\n") }
	before := lines()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if code, body := o.p.readyz(); code != wantReady {
			t.Errorf("%s: /readyz = %d %s, want %d", what, code, body, wantReady)
		}
		o.untouched(what)
	}
	written := lines() - before
	t.Logf("%s for %v: %d log lines, %s", what, d, written, o.figures())
	if written > maxOutageLogLines {
		t.Errorf("%s for %v: %d log lines, want at most %d:\n%s", what, d, written, maxOutageLogLines, o.p.stderr.String())
	}
}

// recovered waits until the agent leads the taint and its pod cache is synced.
func (o *outageCheck) recovered(what string) {
	o.t.Helper()
	eventually(o.t, podCacheResumeBound+15*time.Second, what+": the agent leads the taint and its cache is synced", func() bool {
		return o.p.metric(o.t, "istio_cni_taint_leader") == 1 && o.p.metric(o.t, "istio_cni_pod_cache_synced") == 1
	})
}

// back waits until the agent has recovered, and checks that it holds no more
// goroutines than at the start.
func (o *outageCheck) back(what string) {
	t := o.t
	t.Helper()
	o.recovered(what)
	if g := o.p.metric(t, "go_goroutines"); g > o.baseGoroutines+maxGoroutineGrowth {
		t.Errorf("%s: %v goroutines, %v at the start: more than %d more", what, g, o.baseGoroutines, maxGoroutineGrowth)
	}
	t.Logf("%s: %s", what, o.figures())
}

// outageEnv runs the agent as the chart does, with the node readiness taint on, its
// lease short.
var outageEnv = []string{"POD_CACHE_ENABLED=true", "REPAIR_ENABLED=true", "REPAIR_REPAIR_PODS=false", "REPAIR_DELETE_PODS=true", "REPAIR_LABEL_PODS=true",
	"TAINT_ENABLED=true", "TAINT_LEASE_DURATION=2s", "TAINT_RENEW_DEADLINE=1500ms", "TAINT_RETRY_PERIOD=200ms"}

// TestAgentRidesOutAnAPIServerThatHangsGoesAwayAndComesBack runs the agent as the
// chart does (pod cache, repair, the node readiness taint, the plugin's own token,
// the exit decision) against a real kube-apiserver that fails the ways a node sees
// one fail: hung (SIGSTOP: connections accepted, nothing answered, watches silent),
// gone (stopped: connections refused), and back (started again on the same etcd,
// with an empty watch cache and etcd's revision advanced meanwhile, so the agent's
// watch of its node's pods is answered 410 Gone and lists again). Meanwhile a pod of the node is deleted and created
// again under its name, another deleted, while the agent cannot see it. What must
// hold:
//   - the node's CNI config, the binaries and the plugin's kubeconfig are never
//     touched by the failure, and the agent stays ready (README: none of the API
//     server features gates readiness);
//   - once the API server is back, without a restart: the pod files and pods.sock
//     hold the new pod (its uid and annotation), not the old one, and nothing of
//     the deleted one; the taint controller leads again;
//   - an agent that starts while the API server is gone keeps the config and the
//     previous agent's kubeconfig, is not ready (its token request fails) and says
//     that the earlier kubeconfig is in place, and is ready once the API server is
//     back;
//   - no goroutine growth across the outages, and the log of each is bounded.
func TestAgentRidesOutAnAPIServerThatHangsGoesAwayAndComesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	auditArgs, podReads := auditPodReads(t, "system:serviceaccount:"+ns+":istio-cni")
	c := newExitClusterWith(t, ctx, controlplane.Options{ExtraAPIServerArgs: auditArgs}, taintRules...)
	if err := c.cp.EnsureNamespace(ctx, "apps"); err != nil {
		t.Fatal(err)
	}
	pods := c.admin.CoreV1().Pods("apps")
	withAnnotation := func(p *corev1.Pod, v string) *corev1.Pod {
		p.Annotations = map[string]string{"traffic.sidecar.istio.io/excludeOutboundPorts": v}
		return p
	}
	web, err := pods.Create(ctx, withAnnotation(appPod("web", "node-a"), "1111"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, appPod("gone", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.env = append(c.env, outageEnv...)
	agentPod := c.agentPod(t, ctx, "istio-cni-node-a")
	p := c.start(t, agentPod)

	filesDir := filepath.Join(c.n.runDir, kube.AgentPodFilesDir)
	sock := kube.NewAgentClient(filepath.Join(c.n.runDir, "pods.sock"), time.Second)
	// served is what the plugin would read of apps/NAME: the pod file, and the
	// socket's answer (nil, nil: neither holds it).
	served := func(name string) (file, socket *kube.Pod) {
		file, _ = kube.ReadAgentPodFile(filesDir, "apps", name)
		socket, _ = sock.GetPod(ctx, "apps", name, "", 0)
		return file, socket
	}
	servedAs := func(name string, uid string) bool {
		f, s := served(name)
		return f != nil && s != nil && f.Metadata.UID == uid && s.Metadata.UID == uid
	}
	eventually(t, 20*time.Second, "apps/web is served", func() bool { return servedAs("web", string(web.UID)) })
	o := newOutageCheck(t, c.n, p)

	// Hung, for longer than client-go's HTTP/2 health check (a ping unanswered for
	// 30 s + 15 s closes the connection, and the watches on it fail).
	if err := c.cp.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	o.outage("API server hung", 50*time.Second, http.StatusOK)
	if err := c.cp.ResumeAPIServer(); err != nil {
		t.Fatal(err)
	}
	o.back("after the hang")

	// Gone; then back while the agent cannot see it (stopped with SIGSTOP), and
	// apps/web replaced (a new uid, a new annotation) and apps/gone deleted.
	if err := c.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	o.outage("API server gone", 10*time.Second, http.StatusOK)
	// Written meanwhile (directly into etcd): the restarted API server cannot resume
	// the agent's watch, from a version before it, and answers 410 Gone.
	if err := c.cp.AdvanceRevision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := c.cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	const relists = "relist spec.nodeName=node-a"
	relistsBefore := podReads()[relists]
	for _, name := range []string{"web", "gone"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	if web, err = pods.Create(ctx, withAnnotation(appPod("web", "node-a"), "2222"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	o.back("after the API server came back")
	o.untouched("after the outages")
	// Until the watch is resumed (client-go's back-off: up to 60 s) the cache
	// serves what it held; apps/web's new uid is not served as the old pod's.
	eventually(t, podCacheResumeBound+15*time.Second, "apps/web served as the new pod, apps/gone not at all", func() bool {
		gf, gs := served("gone")
		return servedAs("web", string(web.UID)) && gf == nil && gs == nil
	})
	t.Logf("the pod cache served the new apps/web %v after the agent could see the API server again", time.Since(resumed).Round(time.Millisecond))
	if f, _ := served("web"); f.Metadata.Annotations["traffic.sidecar.istio.io/excludeOutboundPorts"] != "2222" {
		t.Errorf("apps/web's file has the annotations %v, want the new pod's", f.Metadata.Annotations)
	}
	if n := podReads()[relists]; n <= relistsBefore {
		t.Errorf("the agent read all its node's pods %d times before the API server came back, %d after: want it to list them again", relistsBefore, n)
	}

	// Restarted while the API server is gone: the exit keeps the plugin (the
	// decision cannot be asked), and the new agent keeps the config and the
	// previous kubeconfig, not ready until its token request succeeds, and says so.
	if err := c.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	p.stop(t)
	o.untouched("after an exit while the API server is gone")
	p = c.n.startAgent(t, append(c.env, "POD_NAME="+agentPod.Name)...)
	o.p = p // its goroutines once back: no more than the first agent's at the start
	o.outage("agent started while the API server is gone", 10*time.Second, http.StatusServiceUnavailable)
	const keptSays = "is not written by this agent yet (an earlier agent's is in place, and the plugin uses it meanwhile): no plugin token"
	if _, body := p.readyz(); !strings.Contains(body, keptSays) {
		t.Errorf("/readyz = %s, want it to say %q", body, keptSays)
	}
	if err := c.cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// Its token request is retried after 1 s doubling to 30 s, and bounded to 10 s.
	eventually(t, 60*time.Second, "the agent started during the outage is ready once the API server is back", p.ready)
	o.back("the agent started during the outage, once the API server is back")
	eventually(t, podCacheResumeBound+15*time.Second, "apps/web served as the new pod", func() bool { return servedAs("web", string(web.UID)) })
}

// podCacheResumeBound is how long after the API server is back the pod cache's
// watch may take to resume: client-go's reflector retries a failed watch after its
// back-off, 0.8 s doubling to 30 s with a jitter of up to as much again (reset after
// 2 min without a failure), so up to 60 s after a long outage.
const podCacheResumeBound = 60 * time.Second

// TestAgentRidesOutAnAPIServerAnswering429And5xx: the agent reaches the API server
// through a proxy (a load balancer) that, for a while, answers every request with
// 429 and Retry-After (what API Priority and Fairness answers a flow it rejects),
// then with 500 (an API server that cannot reach etcd), and drops the connections
// open, watches included. The agent stays ready and installed, its log bounded, and
// recovers when the answers are good again.
func TestAgentRidesOutAnAPIServerAnswering429And5xx(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx, taintRules...)
	proxy := newFaultProxy(t, c.cp)
	// The agent trusts the proxy (its CA as the ServiceAccount's ca.crt) and talks
	// to it as to the API server.
	writeFile(t, filepath.Join(c.n.saDir, "ca.crt"), proxy.caPEM, 0o644)
	c.env = append(append(c.env, outageEnv...), "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+proxy.port)
	p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-a"))
	o := newOutageCheck(t, c.n, p)
	for _, code := range []int{http.StatusTooManyRequests, http.StatusInternalServerError} {
		what := fmt.Sprintf("API server answering %d", code)
		proxy.fail(code)
		// Refused its lease's renewal, the agent stops leading.
		eventually(t, 20*time.Second, what+": the agent no longer leads the taint", func() bool {
			return p.metric(t, "istio_cni_taint_leader") == 0
		})
		o.outage(what, 10*time.Second, http.StatusOK)
		proxy.fail(0)
		o.back("after the " + what)
	}
}

// faultProxy is an HTTPS reverse proxy to a control plane's API server which, while
// told to fail, answers every request with that status instead.
type faultProxy struct {
	srv    *httptest.Server
	caPEM  []byte // the CA of its serving certificate
	port   string
	status atomic.Int32 // 0: forward
}

func newFaultProxy(t *testing.T, cp *controlplane.ControlPlane) *faultProxy {
	t.Helper()
	ca, err := controlplane.NewCA("fault-proxy")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "fault-proxy"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cp.CAData())
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	rp.FlushInterval = -1                    // watches stream
	rp.ErrorLog = log.New(io.Discard, "", 0) // a request cut by fail is no news
	f := &faultProxy{caPEM: ca.CertPEM}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := int(f.status.Load())
		if code == 0 {
			rp.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		if code != http.StatusTooManyRequests {
			w.Header().Del("Retry-After")
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"fault proxy: %s","code":%d}`, http.StatusText(code), code)
	}))
	f.srv.EnableHTTP2 = true
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	_, f.port, _ = net.SplitHostPort(f.srv.Listener.Addr().String())
	return f
}

// fail makes the proxy answer every request with code (0: forward again) and
// closes the connections open, so that the watches on them start again.
func (f *faultProxy) fail(code int) {
	f.status.Store(int32(code))
	f.srv.CloseClientConnections()
}
