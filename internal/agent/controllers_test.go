package agent

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/silent"
)

// TestRepairUsesThePluginConfigTheAgentInstalls: a repair in place programs a pod with
// the config the plugin gets from the runtime: the installed entry, with the cniVersion
// and name a chain adds when the entry has none, and the entry's own when it has them.
func TestRepairUsesThePluginConfigTheAgentInstalls(t *testing.T) {
	cases := []struct {
		name             string
		env              map[string]string
		wantVersion      string
		wantName         string
		wantBackend      plugin.Backend
		wantExcluded     []string
		wantIptablesMode iptables.Mode
	}{{
		name:         "generated entry: no cniVersion, name istio-cni",
		env:          map[string]string{"EXCLUDE_NAMESPACES": "kube-system", "IPTABLES_MODE": "legacy"},
		wantVersion:  standaloneCNIVersion,
		wantName:     "istio-cni",
		wantBackend:  plugin.BackendIptables,
		wantExcluded: []string{"kube-system"}, wantIptablesMode: iptables.ModeLegacy,
	}, {
		name:         "template with its own cniVersion and name, nftables",
		env:          map[string]string{"CNI_NETWORK_CONFIG": `{"cniVersion":"1.0.0","name":"mesh","type":"istio-cni","native_nftables":true,"exclude_namespaces":["a"]}`},
		wantVersion:  "1.0.0",
		wantName:     "mesh",
		wantBackend:  plugin.BackendNftables,
		wantExcluded: []string{"a"},
	}, {
		name:        "template without cniVersion or name",
		env:         map[string]string{"CNI_NETWORK_CONFIG": `{"type":"istio-cni","cni_agent_run_dir":"/run/x"}`},
		wantVersion: standaloneCNIVersion,
		wantName:    "istio-cni",
		wantBackend: plugin.BackendIptables,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.env)
			entry, err := Entry(&s, s.NetworkConfig)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := repairPluginConfig(entry)
			if err != nil {
				t.Fatalf("repairPluginConfig: %v", err)
			}
			got := []any{cfg.CNIVersion, cfg.Name, cfg.Backend, cfg.ExcludeNamespaces, cfg.IptablesMode}
			want := []any{tc.wantVersion, tc.wantName, tc.wantBackend, tc.wantExcluded, tc.wantIptablesMode}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("cniVersion, name, backend, excluded, iptables mode (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRestConfigUsesTheAgentsSettings: the agent's API client talks to the server the
// plugin's kubeconfig names, reads the token from its file (re-read on rotation) and
// trusts the same CA, or none with SKIP_TLS_VERIFY.
func TestRestConfigUsesTheAgentsSettings(t *testing.T) {
	s := mustParse(t, map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443",
		"SERVICE_ACCOUNT_DIR": "/sa", "KUBE_CA_FILE": "/pki/ca.pem"})
	c := RestConfig(&s)
	got := []any{c.Host, c.BearerTokenFile, c.BearerToken, c.TLSClientConfig.CAFile, c.TLSClientConfig.Insecure}
	want := []any{"https://[fd00::1]:6443", "/sa/token", "", "/pki/ca.pem", false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("host, token file, token, CA file, insecure (-want +got):\n%s", diff)
	}
	s = mustParse(t, map[string]string{"SKIP_TLS_VERIFY": "true", "KUBERNETES_SERVICE_PROTOCOL": "http"})
	c = RestConfig(&s)
	got = []any{c.Host, c.TLSClientConfig.CAFile, c.TLSClientConfig.Insecure}
	want = []any{"http://10.96.0.1:443", "", true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("host, CA file, insecure (-want +got):\n%s", diff)
	}
}

// TestAPIServerFeaturesNeverHoldBackReadinessOrShutdown: with every API server feature
// on and an API server that accepts connections but never answers (the worst case: no
// quick refusal), the agent still installs and becomes ready, and SIGTERM still ends
// in an exit 0 within the chart's grace period (terminationGracePeriodSeconds, after
// which the kubelet kills the agent), although the taint controller cannot release
// its lease, the informers never sync and the exit decision gets no answer: with
// UNINSTALL_ON_EXIT=always the agent uninstalls; with auto it keeps the plugin, as
// for any API server that does not answer, and says why.
func TestAPIServerFeaturesNeverHoldBackReadinessOrShutdown(t *testing.T) {
	grace := chartGracePeriod(t)
	for _, mode := range []ExitMode{ExitAlways, ExitAuto} {
		t.Run(string(mode), func(t *testing.T) {
			_, port, _ := net.SplitHostPort(silent.Listen(t, "tcp", "127.0.0.1:0").Addr.String())

			n := newNode(t)
			n.writeCalico(t)
			before := snapshot(t, n.confDir)
			p := n.startAgent(t, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+port,
				"NODE_NAME=node-a", "POD_NAME=istio-cni-node-a", "POD_NAMESPACE=istio-system",
				"POD_CACHE_ENABLED=true", "REPAIR_ENABLED=true", "REPAIR_PROC_DIR=/proc", "TAINT_ENABLED=true",
				"UNINSTALL_ON_EXIT="+string(mode))
			p.waitReady(t)
			p.waitLog(t, "the features start", `API server features started.*podCache=true repair=true taint=true`)
			if v := p.metric(t, "istio_cni_pod_cache_synced"); v != 0 {
				t.Errorf("istio_cni_pod_cache_synced = %v with a silent API server, want 0", v)
			}
			start := time.Now()
			p.stop(t)
			if took := time.Since(start); took >= grace {
				t.Errorf("shutdown took %s, want it within the chart's grace period, %s", took, grace)
			}
			if mode == ExitAlways {
				if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
					t.Errorf("conf dir after SIGTERM differs (-before +after):\n%s", diff)
				}
			} else {
				p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*cannot read this agent's pod istio-system/istio-cni-node-a`)
				if !hasEntryLast(filepath.Join(n.confDir, "10-calico.conflist")) {
					t.Errorf("the entry is gone after an exit the API server did not answer")
				}
			}
			if _, err := os.Stat(filepath.Join(n.runDir, plugin.PodCacheSocketName)); !os.IsNotExist(err) {
				t.Errorf("pods.sock left behind: %v", err)
			}
		})
	}
}

// TestAnAPIServerThatRefusesTheLeaseIsLoggedOnce: every agent campaigns for the
// taint's Lease, and client-go's elector logged each failed attempt at error: with
// the API server down, one line each TAINT_RETRY_PERIOD (2 s to 4.4 s with its
// jitter), over a thousand an hour on every node, all saying the same. Now the
// failure is logged once until its error changes.
func TestAnAPIServerThatRefusesTheLeaseIsLoggedOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close() // connections are refused from now on

	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+port,
		"NODE_NAME=node-a", "POD_NAME=istio-cni-node-a", "POD_NAMESPACE=istio-system",
		"TAINT_ENABLED=true", "TAINT_LEASE_DURATION=1s", "TAINT_RENEW_DEADLINE=500ms", "TAINT_RETRY_PERIOD=100ms")
	p.waitReady(t)
	p.waitLog(t, "the taint controller campaigns", `API server features started.*taint=true`)
	p.waitLog(t, "the refused Lease is logged", `connection refused`)
	time.Sleep(3 * time.Second) // 14 to 30 attempts at 100 ms, jittered up to 220 ms
	log := p.stderr.String()
	if n := strings.Count(log, "connection refused"); n != 1 {
		t.Errorf("a steadily refused Lease logged %d lines over 3 s, want 1:\n%s", n, log)
	}
	p.stop(t)
}
