//go:build !unitonly

package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// checkNode is one pod's sandbox on a node for CHECK's tests: a real network
// namespace, the plugin's config for one backend, and an API server stand-in that
// holds the pod and its namespace, which a case edits (or stops) after the ADD.
type checkNode struct {
	t       *testing.T
	ns      string
	backend string // "iptables" or "nftables"
	conf    []byte
	cfg     *Config
	srv     *httptest.Server
	stderr  bytes.Buffer

	mu          sync.Mutex
	pod         *kube.Pod
	nsLabels    map[string]string
	unreachable bool
}

func newCheckNode(t *testing.T, backend string, pod *kube.Pod) *checkNode {
	t.Helper()
	n := &checkNode{t: t, backend: backend, pod: pod, nsLabels: map[string]string{"kubernetes.io/metadata.name": "default"}}
	n.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.unreachable {
			// As a node cut off from the API server sees it: no answer.
			hj, _ := w.(http.Hijacker)
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		var v any
		switch r.URL.Path {
		case "/api/v1/namespaces/default/pods/web-1":
			v = n.pod
		case "/api/v1/namespaces/default":
			v = kube.Namespace{Metadata: kube.ObjectMeta{Name: "default", Labels: n.nsLabels}}
		default:
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(n.srv.Close)
	lc := lookupConfig(t, n.srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: n.srv.Certificate().Raw}))
	// Where the agent writes it: the config names its run dir, not a kubeconfig.
	if err := os.Rename(lc.Kubeconfig, filepath.Join(lc.AgentRunDir, KubeconfigName)); err != nil {
		t.Fatal(err)
	}
	ns, err := testns.New(shortdir.New(t), "pod")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	n.ns = ns
	extra := `"iptables_mode":"nft"`
	if backend == "nftables" {
		extra = `"native_nftables":true`
	}
	n.conf = fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":"","log_socket":"",`+
		`"pod_lookup":{"retries":2,"interval":"10ms"},%s,`+
		`"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}}`, lc.AgentRunDir, extra)
	if n.cfg, err = ParseConfig(n.conf); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *checkNode) args() *cnicmd.CmdArgs {
	return &cnicmd.CmdArgs{ContainerID: "c1", Netns: n.ns, IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_UID=uid-1", StdinData: n.conf}
}

func (n *checkNode) plugin() *Plugin {
	return &Plugin{Stdout: &bytes.Buffer{}, Stderr: &n.stderr, Timeout: time.Minute}
}

// editPod changes the pod as the API server holds it (a case's since runs
// holding n.mu).
func (n *checkNode) editPod(mod func(p *kube.Pod)) { mod(n.pod) }

// run runs cmd in the pod's network namespace.
func (n *checkNode) run(cmd ...string) {
	n.t.Helper()
	testns.Run(n.t, n.ns, exec.Command(cmd[0], cmd[1:]...))
}

// olderRules writes, in place of the ADD's, the rules of a plugin whose plan for
// the pod had one exclusion fewer (an upgrade since changed its rules): a
// complete capture, only not the one this plugin builds now.
func (n *checkNode) olderRules() {
	n.t.Helper()
	pp, err := PlanFor(PodArgs{Namespace: "default", Name: "web-1", UID: "uid-1"}, n.cfg, n.pod, nil,
		Sandbox{Addrs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}, Netns: n.ns})
	if err != nil || pp.Plan == nil {
		n.t.Fatalf("plan: %v (%+v)", err, pp.Decision)
	}
	plan := pp.Plan
	tp := &plan.Families[0].Tables[0]
	i := slices.IndexFunc(tp.Rules, func(r redirect.Rule) bool {
		return r.Chain == redirect.ChainOutputOurs && r.Target.Kind == redirect.TargetReturn
	})
	if i < 0 {
		n.t.Fatalf("no RETURN in %s to leave out: %+v", redirect.ChainOutputOurs, tp.Rules)
	}
	tp.Rules = slices.Delete(tp.Rules, i, i+1)
	b, err := NewBackend(n.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	if _, err := capture.Apply(context.Background(), n.ns, b, plan); err != nil {
		n.t.Fatal(err)
	}
}

// flushRedirect empties the chain that sends the pod's outbound traffic to the
// proxy: the capture is broken (outbound traffic leaves the pod unproxied).
func (n *checkNode) flushRedirect() {
	if n.backend == "nftables" {
		n.run("nft", "flush", "chain", "ip", "istio-proxy-nat", redirect.ChainRedirect)
		return
	}
	n.run("iptables-nft", "-t", "nat", "-F", redirect.ChainRedirect)
}

// cutOutputHook deletes the jump from the OUTPUT hook into our chains: the chains
// are all there, but no outbound packet reaches them.
func (n *checkNode) cutOutputHook() {
	if n.backend == "nftables" {
		n.run("nft", "flush", "chain", "ip", "istio-proxy-nat", "output")
		return
	}
	n.run("iptables-nft", "-t", "nat", "-D", "OUTPUT", "-j", redirect.ChainOutputOurs)
}

// removeAll removes every rule of ours, as a DEL would.
func (n *checkNode) removeAll() {
	n.t.Helper()
	b, err := NewBackend(n.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	if _, err := capture.Cleanup(context.Background(), n.ns, b, nil); err != nil {
		n.t.Fatal(err)
	}
}

// What CHECK logs of a capture it passes although it cannot compare it with the
// pod's settings, or they ask for other rules now.
const (
	notKnown   = "give no capture to compare with now"
	otherRules = "with rules other than the pod's settings ask for now"
)

func notInjectedPod(mods ...func(p *kube.Pod)) *kube.Pod {
	return injectedPod(append([]func(p *kube.Pod){notInjected}, mods...)...)
}

// TestCHECKFailsOnlyWhenTheCaptureIsBroken: CRI-O runs CHECK right after each ADD
// and, for config lists of CNI 0.4.0 and later, for every sandbox each time it
// starts; a CHECK that fails then leaves the sandbox without an address, and the
// kubelet recreates the pod. So CHECK must pass a pod whose capture is in place
// although the pod cannot be read now (the API server and the agent unreachable),
// or its inputs changed since the ADD, which Kubernetes does not run again: an
// annotation edited (valid or not), the pod or its namespace labelled ambient, the
// rules written by an older plugin. And it must fail where the capture the ADD
// installed is missing or cut: a chain flushed, the hook's jump deleted, all rules
// removed, whatever changed besides. Real network namespaces, the plugin's own
// ADD and CHECK, both backends.
func TestCHECKFailsOnlyWhenTheCaptureIsBroken(t *testing.T) {
	root.Require(t)
	for _, tc := range []struct {
		name  string
		pod   func(mods ...func(p *kube.Pod)) *kube.Pod
		since func(n *checkNode)
		// wantErr is empty for a CHECK that passes, else what its error says.
		wantErr string
		// wantLog is what the log says of a CHECK that passes although something
		// changed.
		wantLog string
	}{
		{"unchanged", injectedPod, func(*checkNode) {}, "", ""},
		{"the pod cannot be looked up", injectedPod, func(n *checkNode) { n.unreachable = true }, "", notKnown},
		{"an annotation edited since the ADD", injectedPod, func(n *checkNode) {
			n.editPod(withAnnotation(AnnotationExcludeOutboundPorts, "9000"))
		}, "", otherRules},
		{"an invalid annotation edited in since the ADD", injectedPod, func(n *checkNode) {
			n.editPod(withAnnotation(AnnotationExcludeOutboundPorts, "nine"))
		}, "", notKnown},
		{"the interception mode edited to TPROXY since the ADD", injectedPod, func(n *checkNode) {
			n.editPod(withAnnotation(AnnotationInterceptionMode, "TPROXY"))
		}, "", otherRules},
		{"the rules of an older plugin", injectedPod, func(n *checkNode) { n.olderRules() }, "", otherRules},
		{"the sidecar's pod labelled not to be injected since the ADD", injectedPod, func(n *checkNode) {
			n.editPod(withLabel("sidecar.istio.io/inject", "false"))
		}, "", ""},
		{"passed through, nothing changed", notInjectedPod, func(*checkNode) {}, "", ""},
		{"passed through, its namespace labelled ambient since", notInjectedPod, func(n *checkNode) {
			n.nsLabels = map[string]string{LabelDataplaneMode: DataplaneAmbient}
		}, "", notKnown},
		{"passed through, the pod labelled ambient since", notInjectedPod, func(n *checkNode) {
			n.editPod(withLabel(LabelDataplaneMode, DataplaneAmbient))
		}, "", notKnown},

		{"a chain flushed", injectedPod, func(n *checkNode) { n.flushRedirect() }, "ISTIO_REDIRECT", ""},
		{"the output hook's jump deleted", injectedPod, func(n *checkNode) { n.cutOutputHook() }, "ISTIO_OUTPUT", ""},
		{"every rule removed", injectedPod, func(n *checkNode) { n.removeAll() }, "redirection", ""},
		{"the network namespace gone", injectedPod, func(n *checkNode) {
			if err := testns.Delete(n.ns); err != nil {
				n.t.Fatal(err)
			}
		}, "CNI_NETNS", ""},
		{"an annotation edited and a chain flushed", injectedPod, func(n *checkNode) {
			n.editPod(withAnnotation(AnnotationExcludeOutboundPorts, "9000"))
			n.flushRedirect()
		}, "ISTIO_REDIRECT", ""},
		{"the pod cannot be looked up and a chain flushed", injectedPod, func(n *checkNode) {
			n.unreachable = true
			n.flushRedirect()
		}, "ISTIO_REDIRECT", ""},
		{"the older plugin's rules with the output hook's jump deleted", injectedPod, func(n *checkNode) {
			n.olderRules()
			n.cutOutputHook()
		}, "ISTIO_OUTPUT", ""},
	} {
		for _, backend := range []string{"iptables", "nftables"} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				n := newCheckNode(t, backend, tc.pod())
				if err := n.plugin().Add(n.args()); err != nil {
					t.Fatalf("ADD: %v\n%s", err, n.stderr.String())
				}
				if err := n.plugin().Check(n.args()); err != nil {
					t.Fatalf("CHECK right after the ADD: %v", err)
				}
				n.mu.Lock()
				tc.since(n)
				n.mu.Unlock()
				n.stderr.Reset()
				err := n.plugin().Check(n.args())
				switch {
				case tc.wantErr == "" && err != nil:
					t.Errorf("CHECK = %v, want it to pass: the capture the ADD installed is in place\n%s", err, n.stderr.String())
				case tc.wantErr != "" && err == nil:
					t.Errorf("CHECK passed, want it to fail naming %q: the capture is broken\n%s", tc.wantErr, n.stderr.String())
				case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
					t.Errorf("CHECK = %v, want it to name %q", err, tc.wantErr)
				}
				if !strings.Contains(n.stderr.String(), tc.wantLog) {
					t.Errorf("CHECK's log does not say %q:\n%s", tc.wantLog, n.stderr.String())
				}
			})
		}
	}
}
