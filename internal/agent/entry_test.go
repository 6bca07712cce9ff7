package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"

	"github.com/istio-cni/istio-cni/test/harness/golden"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

func mustParse(t *testing.T, env map[string]string) Settings {
	t.Helper()
	s, err := Parse(nil, envOf(withEnv(env)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", name), got)
}

// legacyTemplate is the shape of the CNI_NETWORK_CONFIG Istio's older charts and
// the seed documents' configmap carried.
const legacyTemplate = `{
  "cniVersion": "0.3.1",
  "name": "istio-cni",
  "type": "istio-cni",
  "log_level": "__LOG_LEVEL__",
  "log_uds_address": "__LOG_UDS_ADDRESS__",
  "kubernetes": {
    "kubeconfig": "__KUBECONFIG_FILEPATH__",
    "cni_bin_dir": "__CNI_BIN_DIR__",
    "node_name": "__KUBERNETES_NODE_NAME__",
    "k8s_api_root": "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__",
    "exclude_namespaces": [ "istio-system", "kube-system" ]
  }
}`

func TestEntryFromSettingsAndTemplatesIsWhatThePluginAccepts(t *testing.T) {
	cases := []struct {
		name     string
		env      map[string]string
		template string
	}{
		{"generated-defaults", nil, ""},
		{"generated-every-field", map[string]string{
			"EXCLUDE_NAMESPACES": "kube-system,istio-system", "POD_NAMESPACE": "istio-system", "PLUGIN_LOG_LEVEL": "debug",
			"NATIVE_NFTABLES": "true", "IPTABLES_MODE": "nft", "CNI_AGENT_RUN_DIR": "/run/istio-cni", "AGENT_LOG_AS_JSON": "true",
		}, ""},
		{"generated-maistra-prefix", map[string]string{"CNI_BINARIES_PREFIX": "v2-4-"}, ""},
		{"legacy-template", map[string]string{"PLUGIN_LOG_LEVEL": "warn", "NODE_NAME": "node-a", "CNI_BIN_DIR": "/home/kubernetes/bin"}, legacyTemplate},
		{"template-with-prefix-placeholder", map[string]string{"CNI_BINARIES_PREFIX": "v2-4-"},
			`{"type": "__CNI_BINARIES_PREFIX__istio-cni", "cni_agent_run_dir": "__CNI_AGENT_RUN_DIR__", "pod_namespace": "__POD_NAMESPACE__"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.env)
			got, err := Entry(&s, tc.template)
			if err != nil {
				t.Fatalf("Entry: %v", err)
			}
			checkGolden(t, "entry-"+tc.name+".json", append(got, '\n'))
			cfg, err := plugin.ParseConfig(got)
			if err != nil {
				t.Fatalf("the plugin refuses the entry: %v", err)
			}
			if cfg.Kubeconfig != s.KubeconfigPath() {
				t.Errorf("the plugin would read its kubeconfig from %s, the agent writes it to %s", cfg.Kubeconfig, s.KubeconfigPath())
			}
			if cfg.LogSocket != s.LogSocketPath() {
				t.Errorf("the plugin would log to %s, the agent listens on %s", cfg.LogSocket, s.LogSocketPath())
			}
		})
	}
}

func TestEntryRefusesBadTemplatesNamingTheProblem(t *testing.T) {
	cases := []struct {
		name, template string
		env            map[string]string
		want           []string
	}{
		{"not JSON", `{"type": "istio-cni",`, nil, []string{"CNI_NETWORK_CONFIG", "JSON object"}},
		{"a list", `[{"type": "istio-cni"}]`, nil, []string{"CNI_NETWORK_CONFIG", "JSON object"}},
		{"two objects", `{"type": "istio-cni"} {}`, nil, []string{"more than one"}},
		{"unknown placeholder", `{"type": "istio-cni", "mtu": "__CNI_MTU__"}`, nil, []string{"__CNI_MTU__", "supported"}},
		{"token placeholder", `{"type": "istio-cni", "k8s_auth_token": "__SERVICEACCOUNT_TOKEN__"}`, nil, []string{"__SERVICEACCOUNT_TOKEN__", "readable"}},
		{"kubeconfig file name", `{"type": "istio-cni", "kubernetes": {"kubeconfig": "/etc/cni/net.d/__KUBECONFIG_FILENAME__"}}`, nil, []string{"__KUBECONFIG_FILENAME__", "__KUBECONFIG_FILEPATH__"}},
		{"another plugin", `{"type": "calico"}`, nil, []string{`"calico"`, `"istio-cni"`}},
		{"prefix not in the type", `{"type": "istio-cni"}`, map[string]string{"CNI_BINARIES_PREFIX": "v2-"}, []string{`"v2-istio-cni"`, "CNI_BINARIES_PREFIX"}},
		{"a value the plugin refuses", `{"type": "istio-cni", "plugin_log_level": "loud"}`, nil, []string{"plugin_log_level", `"loud"`}},
		{"ambient mode", `{"type": "istio-cni", "ambient_enabled": true}`, nil, []string{"ambient_enabled", "no ambient mode"}},
		{"a uid no process has", `{"type": "istio-cni", "extra_bypass_uids": [4294967295]}`, nil, []string{"extra_bypass_uids", "4294967295"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.env)
			_, err := Entry(&s, tc.template)
			wanterr.Mentions(t, err, tc.want...)
		})
	}
}

// TestLegacyTemplatesAPIRootIsAURLOnAnIPv6Cluster: the legacy template's
// "k8s_api_root": "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__"
// must become a URL on an IPv6 cluster too, where Kubernetes sets
// KUBERNETES_SERVICE_HOST to a bare IPv6 address: filled as given
// (https://fd00:10:96::1:443) it is no URL, the plugin refuses the entry and the
// agent never installs it. A template that brackets the placeholder itself
// gets one pair of brackets, and only for IPv6.
func TestLegacyTemplatesAPIRootIsAURLOnAnIPv6Cluster(t *testing.T) {
	cases := []struct {
		name, host, template, want string
	}{
		{"IPv4", "10.96.0.1", legacyTemplate, "https://10.96.0.1:443"},
		{"a host name", "kubernetes.default.svc", legacyTemplate, "https://kubernetes.default.svc:443"},
		{"IPv6", "fd00:10:96::1", legacyTemplate, "https://[fd00:10:96::1]:443"},
		{"IPv6 given in brackets", "[fd00:10:96::1]", legacyTemplate, "https://[fd00:10:96::1]:443"},
		{"IPv6, the template brackets it", "fd00:10:96::1",
			`{"type": "istio-cni", "kubernetes": {"k8s_api_root": "https://[__KUBERNETES_SERVICE_HOST__]:__KUBERNETES_SERVICE_PORT__"}}`,
			"https://[fd00:10:96::1]:443"},
		{"IPv4, the template brackets it", "10.96.0.1",
			`{"type": "istio-cni", "kubernetes": {"k8s_api_root": "https://[__KUBERNETES_SERVICE_HOST__]:__KUBERNETES_SERVICE_PORT__"}}`,
			"https://10.96.0.1:443"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, map[string]string{"KUBERNETES_SERVICE_HOST": tc.host})
			got, err := Entry(&s, tc.template)
			if err != nil {
				t.Fatalf("Entry: %v", err)
			}
			cfg, err := plugin.ParseConfig(got)
			if err != nil {
				t.Fatalf("the plugin refuses the entry: %v", err)
			}
			if cfg.K8sAPIRoot != tc.want {
				t.Errorf("k8s_api_root = %q, want %q", cfg.K8sAPIRoot, tc.want)
			}
		})
	}
}

// TestATemplateHoldsTheSettingsGivenBesideIt: the agent uses a template's entry
// as written, so a plugin setting a flag or variable gives beside it, which
// Istio's install-cni would write into its entry, must be in the entry too, or
// the agent refuses to start naming both: before, an EXCLUDE_NAMESPACES (Istio's
// ConfigMap's) beside an older chart's CNI_NETWORK_CONFIG was ignored, and the
// pods of the namespaces it named were captured. A placeholder holds its
// setting, and a setting left to its default is not checked.
func TestATemplateHoldsTheSettingsGivenBesideIt(t *testing.T) {
	cases := []struct {
		name, template string
		env            map[string]string
		want           []string // the error's text; none: accepted
	}{
		{"the legacy template, its exclusions and its level placeholder", legacyTemplate,
			map[string]string{"EXCLUDE_NAMESPACES": "kube-system,istio-system,kube-system", "PLUGIN_LOG_LEVEL": "debug"}, nil},
		{"every setting as the template has it",
			`{"type": "istio-cni", "exclude_namespaces": ["a", "b"], "plugin_log_level": "WARN", "native_nftables": true, "iptables_mode": "nft"}`,
			map[string]string{"EXCLUDED_NAMESPACES": "b,a", "LOG_LEVEL": "warn", "NATIVE_NFTABLES": "true", "IPTABLES_MODE": "nft"}, nil},
		{"settings left to their defaults", `{"type": "istio-cni", "exclude_namespaces": ["a"], "plugin_log_level": "debug", "native_nftables": true}`, nil, nil},
		{"Istio's ConfigMap's exclusions beside a template without them", `{"type": "istio-cni"}`,
			map[string]string{"EXCLUDE_NAMESPACES": "kube-system"},
			[]string{`CNI_NETWORK_CONFIG: environment variable EXCLUDE_NAMESPACES "kube-system", but the entry it gives excludes no namespace (exclude_namespaces)`,
				"the setting would be ignored", "write it into the template"}},
		{"other exclusions than the legacy key's", `{"type": "istio-cni", "kubernetes": {"exclude_namespaces": ["istio-system"]}}`,
			map[string]string{"EXCLUDED_NAMESPACES": "istio-system,kube-system"},
			[]string{`environment variable EXCLUDED_NAMESPACES "istio-system,kube-system"`, `excludes "istio-system" (exclude_namespaces)`}},
		{"native nftables the template does not ask for", `{"type": "istio-cni"}`, map[string]string{"NATIVE_NFTABLES": "true"},
			[]string{`environment variable NATIVE_NFTABLES "true"`, "has native_nftables false"}},
		{"iptables asked for, native nftables in the template", `{"type": "istio-cni", "native_nftables": true}`, map[string]string{"NATIVE_NFTABLES": "false"},
			[]string{`environment variable NATIVE_NFTABLES "false"`, "has native_nftables true"}},
		{"an iptables mode the template leaves to detection", `{"type": "istio-cni"}`, map[string]string{"IPTABLES_MODE": "legacy"},
			[]string{`environment variable IPTABLES_MODE "legacy"`, "has iptables_mode auto (detected)"}},
		{"another plugin level", `{"type": "istio-cni", "plugin_log_level": "info"}`, map[string]string{"PLUGIN_LOG_LEVEL": "debug"},
			[]string{`environment variable PLUGIN_LOG_LEVEL "debug"`, "logs at info (plugin_log_level)"}},
		{"the plugin's scope of the agent's level", `{"type": "istio-cni", "plugin_log_level": "info"}`, map[string]string{"AGENT_LOG_LEVEL": "default:info,cni-plugin:debug"},
			[]string{`environment variable AGENT_LOG_LEVEL "default:info,cni-plugin:debug"`, "logs at info"}},
		{"every setting named at once", `{"type": "istio-cni"}`,
			map[string]string{"EXCLUDE_NAMESPACES": "a", "NATIVE_NFTABLES": "true", "PLUGIN_LOG_LEVEL": "debug"},
			[]string{"EXCLUDE_NAMESPACES", "NATIVE_NFTABLES", "PLUGIN_LOG_LEVEL"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.env)
			_, err := Entry(&s, tc.template)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Entry: %v", err)
				}
				return
			}
			wanterr.Mentions(t, err, tc.want...)
		})
	}
	t.Run("the file's name for CNI_NETWORK_CONFIG_FILE", func(t *testing.T) {
		s := mustParse(t, map[string]string{"EXCLUDE_NAMESPACES": "a", "CNI_NETWORK_CONFIG_FILE": "/etc/istio-cni/entry.json"})
		_, err := Entry(&s, `{"type": "istio-cni"}`)
		wanterr.Mentions(t, err, `CNI_NETWORK_CONFIG_FILE "/etc/istio-cni/entry.json": environment variable EXCLUDE_NAMESPACES "a"`)
	})
}

func TestTemplateValuesAreJSONEscaped(t *testing.T) {
	s := mustParse(t, map[string]string{"CNI_BIN_DIR": `/opt/we"ird\bin`})
	got, err := Entry(&s, `{"type": "istio-cni", "kubernetes": {"cni_bin_dir": "__CNI_BIN_DIR__"}}`)
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Kubernetes struct {
			CNIBinDir string `json:"cni_bin_dir"`
		} `json:"kubernetes"`
	}
	if err := json.Unmarshal(got, &e); err != nil {
		t.Fatal(err)
	}
	if e.Kubernetes.CNIBinDir != `/opt/we"ird\bin` {
		t.Errorf("cni_bin_dir = %q", e.Kubernetes.CNIBinDir)
	}
}

// testCA returns a self-signed CA certificate in PEM.
func testCA(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestKubeconfigIsReadByThePluginsLoader(t *testing.T) {
	ca := testCA(t)
	cases := []struct {
		name       string
		env        map[string]string
		wantServer string
		wantCA     bool
		wantSkip   bool
	}{
		{"ipv4 with CA", nil, "https://10.96.0.1:443", true, false},
		{"ipv6 host is bracketed", map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://[fd00::1]:6443", true, false},
		{"skip TLS verify carries no CA", map[string]string{"SKIP_TLS_VERIFY": "true", "KUBERNETES_SERVICE_HOST": "api.example.com"}, "https://api.example.com:443", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.env)
			data, err := Kubeconfig(&s, []byte("tok.en-123\n"), ca)
			if err != nil {
				t.Fatal(err)
			}
			kc, err := kube.ParseKubeconfig(data, "/")
			if err != nil {
				t.Fatalf("the plugin cannot read the kubeconfig: %v\n%s", err, data)
			}
			if kc.Server != tc.wantServer || kc.Token != "tok.en-123" || kc.InsecureSkipTLSVerify != tc.wantSkip || bytes.Equal(kc.CAData, ca) != tc.wantCA {
				t.Errorf("plugin reads server %q token %q skip %v CA %v; want %q, the token, %v, %v",
					kc.Server, kc.Token, kc.InsecureSkipTLSVerify, len(kc.CAData) > 0, tc.wantServer, tc.wantSkip, tc.wantCA)
			}
		})
	}
}

func TestKubeconfigRefusesWhatWouldFailEveryLookup(t *testing.T) {
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": "/sa"})
	cases := []struct {
		name      string
		token, ca []byte
		want      string
	}{
		{"empty token", []byte(" \n"), testCA(t), "token /sa/token is empty"},
		{"two-line token", []byte("a\nb"), testCA(t), "more than one line"},
		{"CA without a certificate", []byte("t"), []byte("not pem"), "CA file /sa/ca.crt: holds no PEM certificate"},
		{"broken certificate", []byte("t"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}), "bad certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Kubeconfig(&s, tc.token, tc.ca)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// chainExec runs a chain's plugins as the runtime's CNI library execs them: the
// primary faked (an empty result of the version it is given), istio-cni's own
// dispatcher and commands in process.
type chainExec struct{}

func (e chainExec) ExecPlugin(_ context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	if path != cniconf.PluginType {
		return []byte(`{}`), nil
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	var out, stderr bytes.Buffer
	p := &plugin.Plugin{Stdout: &out, Stderr: &stderr, Timeout: time.Minute}
	if err := cnicmd.Run(cnicmd.Env{Getenv: func(k string) string { return env[k] }, Stdin: bytes.NewReader(stdin), Stdout: &out, Stderr: &stderr},
		p.Funcs(), plugin.SupportedVersions, ""); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (chainExec) FindInPath(plugin string, _ []string) (string, error) { return plugin, nil }

func (chainExec) Decode(data []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(data)
}

// TestTheAgentInsertsOnlyIntoChainsThePluginSpeaks: the agent puts its entry into
// a primary config (speaksVersionOf) exactly when the runtime's CNI library then
// runs the chain's ADD without the plugin refusing the version the chain gives it.
// A config that names no cniVersion (flannel's old .conf) gives its plugins none,
// which they read as 0.1.0: inserting into it failed every pod's ADD with
// "incompatible CNI versions".
func TestTheAgentInsertsOnlyIntoChainsThePluginSpeaks(t *testing.T) {
	runDir := t.TempDir()
	entry := []byte(fmt.Sprintf(`{"type":"istio-cni","cni_agent_run_dir":%q,"log_socket":"","log_file":""}`, runDir))
	for _, tc := range []struct{ file, primary string }{
		{"10-flannel.conf", `{"name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}`},
		{"10-old.conflist", `{"name":"old","cniVersion":"0.2.0","plugins":[{"type":"bridge"}]}`},
		{"10-flannel.conflist", `{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel"},{"type":"portmap"}]}`},
		{"10-calico.conflist", `{"name":"k8s-pod-network","cniVersion":"1.0.0","plugins":[{"type":"calico"}]}`},
		{"10-ptp.conflist", `{"name":"ptp","cniVersion":"1.1.0","plugins":[{"type":"ptp"}]}`},
		{"10-versions.conflist", `{"name":"v","cniVersions":["0.4.0","1.1.0"],"plugins":[{"type":"ptp"}]}`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			out, _, err := cniconf.Insert([]byte(tc.primary), tc.file, entry)
			if err != nil {
				t.Fatal(err)
			}
			inserts := speaksVersionOf(out)
			list, err := libcni.ConfListFromBytes(out)
			if err != nil {
				t.Fatal(err)
			}
			cni := libcni.NewCNIConfigWithCacheDir([]string{"/opt/cni/bin"}, t.TempDir(), chainExec{})
			rt := &libcni.RuntimeConf{ContainerID: "0123456789abcdef", NetNS: "/var/run/netns/cni-test", IfName: "eth0"}
			_, addErr := cni.AddNetworkList(context.Background(), list, rt)
			if (inserts == nil) != (addErr == nil) {
				t.Errorf("the agent's check: %v; the chain's ADD through libcni: %v; want both to fail or neither", inserts, addErr)
			}
		})
	}
}
