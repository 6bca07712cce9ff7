package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
)

var ignoreKeys = cmpopts.IgnoreUnexported(Config{})

// defaults is the Config of a minimal network config.
func defaults() Config {
	return Config{
		NetConf:     types.NetConf{CNIVersion: "1.0.0", Name: "istio-cni", Type: "istio-cni"},
		LogLevel:    cli.LevelInfo,
		AgentRunDir: "/var/run/istio-cni",
		Kubeconfig:  "/var/run/istio-cni/istio-cni-kubeconfig",
		Backend:     BackendIptables,
		PodLookup:   PodLookup{Retries: 30, Interval: time.Second},
		LogSocket:   "/var/run/istio-cni/pseq.sock",
		LogFile:     "/var/run/istio-cni/istio-cni.log",
	}
}

func TestParseConfigAcceptsEachFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		json string
		want func(c *Config)
	}{
		{
			name: "minimal config gets Istio's defaults",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`,
			want: func(c *Config) {},
		},
		{
			name: "Istio current format as its installer writes it (sidecar mode)",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni",
				"plugin_log_level":"debug","cni_agent_run_dir":"/run/istio-cni",
				"ambient_enabled":false,"enablement_selectors":[{"podSelector":{"matchLabels":{"a":"b"}}}],
				"exclude_namespaces":["istio-system","kube-system"],"pod_namespace":"istio-system","native_nftables":true}`,
			want: func(c *Config) {
				c.LogLevel = cli.LevelDebug
				c.AgentRunDir = "/run/istio-cni"
				c.Kubeconfig = "/run/istio-cni/istio-cni-kubeconfig"
				c.ExcludeNamespaces = []string{"istio-system", "kube-system"}
				c.PodNamespace = "istio-system"
				c.Backend = BackendNftables
				c.LogSocket = "/run/istio-cni/pseq.sock"
				c.LogFile = "/run/istio-cni/istio-cni.log"
			},
		},
		{
			name: "legacy format of the seed documents and Maistra",
			json: `{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni","log_level":"warn",
				"log_uds_address":"/var/run/istio-cni/old.sock","hostNSEnterExec":false,
				"kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-istio-cni-kubeconfig","k8s_api_root":"https://10.96.0.1:443",
				"cni_bin_dir":"/var/lib/cni/bin","exclude_namespaces":["istio-system","kube-system"],
				"intercept_type":"iptables","node_name":"node-a","netns_setup_executable":"istio-iptables.sh",
				"iptables_script":"istio-iptables.sh"}}`,
			want: func(c *Config) {
				c.CNIVersion = "0.3.1"
				c.LogLevel = cli.LevelWarn
				c.Kubeconfig = "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig"
				c.K8sAPIRoot = "https://10.96.0.1:443"
				c.CNIBinDir = "/var/lib/cni/bin"
				c.ExcludeNamespaces = []string{"istio-system", "kube-system"}
				c.NodeName = "node-a"
				c.LogSocket = "/var/run/istio-cni/old.sock"
			},
		},
		{
			name: "a level in capitals, or Istio's other spelling of warn",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","plugin_log_level":" WARNING "}`,
			want: func(c *Config) { c.LogLevel = cli.LevelWarn },
		},
		{
			// Istio's plugin sets its level only from a plugin_log_level that is not
			// empty, and its legacy plugin read any level it did not know as info.
			name: "an empty level is Istio's default",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","plugin_log_level":""}`,
			want: func(c *Config) {},
		},
		{
			name: "an empty legacy level is Istio's default",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","log_level":""}`,
			want: func(c *Config) {},
		},
		{
			name: "a blank level is as if absent",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","plugin_log_level":" \t","log_level":"  "}`,
			want: func(c *Config) {},
		},
		{
			name: "an empty current level leaves the legacy one to speak",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","plugin_log_level":"","log_level":"debug"}`,
			want: func(c *Config) { c.LogLevel = cli.LevelDebug },
		},
		{
			name: "Istio's installer's entry with no level and no namespace excluded",
			json: `{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni","ipam":{},"dns":{},
				"plugin_log_level":"","cni_agent_run_dir":"/var/run/istio-cni","ambient_enabled":false,
				"enablement_selectors":[],"exclude_namespaces":null,"pod_namespace":"istio-system",
				"native_nftables":false,"enable_ambient_detection_retry":false}`,
			want: func(c *Config) {
				c.CNIVersion = "0.3.1"
				c.PodNamespace = "istio-system"
			},
		},
		{
			name: "mixed formats: the current keys win",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni",
				"plugin_log_level":"error","log_level":"debug",
				"cni_agent_run_dir":"/run/agent","exclude_namespaces":[],
				"log_socket":"","log_uds_address":"/old.sock",
				"kubernetes":{"kubeconfig":"/etc/old-kubeconfig","exclude_namespaces":["kube-system"]}}`,
			want: func(c *Config) {
				c.LogLevel = cli.LevelError
				c.AgentRunDir = "/run/agent"
				c.Kubeconfig = "/run/agent/istio-cni-kubeconfig"
				c.ExcludeNamespaces = []string{}
				c.LogSocket = ""
				c.LogFile = "/run/agent/istio-cni.log"
			},
		},
		{
			name: "our additions",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","iptables_mode":"legacy",
				"pod_lookup":{"retries":5,"interval":"200ms"},"extra_bypass_uids":[1337,1000660000,1337],
				"log_socket":"/run/x.sock","log_file":"","log_as_json":true}`,
			want: func(c *Config) {
				c.LogJSON = true
				c.IptablesMode = iptables.ModeLegacy
				c.PodLookup = PodLookup{Retries: 5, Interval: 200 * time.Millisecond}
				c.ExtraBypassUIDs = []uint32{1337, 1000660000}
				c.LogSocket = "/run/x.sock"
				c.LogFile = ""
			},
		},
		{
			// The same spellings as istio-iptables' --iptables-mode and the agent's
			// IPTABLES_MODE (iptables.ParseMode): "auto" is detection.
			name: "iptables mode auto",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","iptables_mode":"auto"}`,
			want: func(c *Config) { c.IptablesMode = iptables.ModeAuto },
		},
		{
			name: "unknown keys and runtime-injected ones are tolerated",
			json: `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","capabilities":{"portMappings":true},
				"runtimeConfig":{"portMappings":[]},"something_new":{"x":1},"kubernetes":{"future":true},
				"log_level":"INFO"}`,
			want: func(c *Config) {
				c.Capabilities = map[string]bool{"portMappings": true}
				c.RuntimeConfig = json.RawMessage(`{"portMappings":[]}`)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			want := defaults()
			tc.want(&want)
			if diff := cmp.Diff(&want, got, ignoreKeys); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrorsNameTheKeyAndValue(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"bad log level", `{"plugin_log_level":"loud"}`,
			`plugin config: "plugin_log_level": "loud" is not a log level (panic, fatal, error, warn, info, debug, none)`},
		{"bad legacy log level", `{"log_level":"verbose"}`,
			`plugin config: "log_level": "verbose" is not a log level (panic, fatal, error, warn, info, debug, none)`},
		{"bad legacy log level beside an empty current one", `{"plugin_log_level":"","log_level":"verbose"}`,
			`plugin config: "log_level": "verbose" is not a log level (panic, fatal, error, warn, info, debug, none)`},
		{"log level of the wrong type", `{"plugin_log_level":3}`,
			`plugin config: "plugin_log_level": got number, want a string`},
		{"nested type error", `{"kubernetes":{"exclude_namespaces":"kube-system"}}`,
			`plugin config: "kubernetes.exclude_namespaces": got string, want a list of strings`},
		{"kubernetes not an object", `{"kubernetes":"yes"}`,
			`plugin config: "kubernetes": got string, want an object`},
		{"bool as string", `{"native_nftables":"true"}`,
			`plugin config: "native_nftables": got string, want true or false`},
		{"negative uid", `{"extra_bypass_uids":[1000,-1]}`,
			`plugin config: "extra_bypass_uids": got number -1, want an integer 0-4294967295`},
		{"uid as string", `{"extra_bypass_uids":["1000"]}`,
			`plugin config: "extra_bypass_uids": got string, want an integer 0-4294967295`},
		{"root uid", `{"extra_bypass_uids":[0]}`,
			`plugin config: "extra_bypass_uids": uid 0 (root) may not bypass redirection`},
		{"uid (uid_t)-1", `{"extra_bypass_uids":[1000,4294967295]}`,
			`plugin config: "extra_bypass_uids": uid 4294967295 is (uid_t)-1, which no process has and iptables refuses`},
		{"fractional retries", `{"pod_lookup":{"retries":1.5}}`,
			`plugin config: "pod_lookup.retries": got number 1.5, want an integer`},
		{"zero retries", `{"pod_lookup":{"retries":0}}`,
			`plugin config: "pod_lookup.retries": 0: at least one try is needed`},
		{"bad interval", `{"pod_lookup":{"interval":"soon"}}`,
			`plugin config: "pod_lookup.interval": "soon" is not a duration (like "1s" or "500ms")`},
		{"negative interval", `{"pod_lookup":{"interval":"-1s"}}`,
			`plugin config: "pod_lookup.interval": -1s: must be positive`},
		{"bad iptables mode", `{"iptables_mode":"fast"}`,
			`plugin config: "iptables_mode": "fast" is not an iptables mode (legacy, nft or auto)`},
		{"bad intercept type", `{"kubernetes":{"intercept_type":"ebpf"}}`,
			`plugin config: "kubernetes.intercept_type": "ebpf" is not an intercept type (iptables)`},
		{"relative run dir", `{"cni_agent_run_dir":"run/istio"}`,
			`plugin config: "cni_agent_run_dir": "run/istio" is not an absolute path`},
		{"relative legacy kubeconfig", `{"kubernetes":{"kubeconfig":"kubeconfig"}}`,
			`plugin config: "kubernetes.kubeconfig": "kubeconfig" is not an absolute path`},
		{"bad namespace in legacy list", `{"kubernetes":{"exclude_namespaces":["Kube_System"]}}`,
			`plugin config: "kubernetes.exclude_namespaces": "Kube_System" is not a namespace name`},
		{"empty namespace", `{"exclude_namespaces":[""]}`,
			`plugin config: "exclude_namespaces": "" is not a namespace name`},
		{"bad pod namespace", `{"pod_namespace":"-x"}`,
			`plugin config: "pod_namespace": "-x" is not a namespace name`},
		{"bad api root", `{"kubernetes":{"k8s_api_root":"10.96.0.1"}}`,
			`plugin config: "kubernetes.k8s_api_root": "10.96.0.1" is not an http(s) URL`},
		{"relative log file", `{"log_file":"cni.log"}`,
			`plugin config: "log_file": "cni.log" is not an absolute path`},
		{"relative legacy socket", `{"log_uds_address":"x.sock"}`,
			`plugin config: "log_uds_address": "x.sock" is not an absolute path`},
		{"ambient mode", `{"ambient_enabled":true}`,
			`plugin config: "ambient_enabled": true is not supported: this istio-cni captures sidecar pods only and has no ambient mode (remove the setting or set it to false)`},
		{"a type error, then a schema that is not an integer", `{"plugin_log_level":3,"config_schema":"2"}`,
			`plugin config: "plugin_log_level": got number, want a string`},
		{"not an object", `["istio-cni"]`,
			`plugin config: must be a JSON object, got array`},
		{"broken JSON", `{"name":"istio-cni",}`,
			`plugin config: invalid JSON at byte 21: invalid character '}' looking for beginning of object key string`},
		{"several errors reported together", `{"plugin_log_level":"x","iptables_mode":"y"}`,
			"plugin config: \"plugin_log_level\": \"x\" is not a log level (panic, fatal, error, warn, info, debug, none)\n" +
				`plugin config: "iptables_mode": "y" is not an iptables mode (legacy, nft or auto)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if err == nil {
				t.Fatalf("ParseConfig(%s) succeeded, want %q", tc.json, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

// The three stages are tested on their own too: decode checks JSON and types only,
// defaulting never fails, validation sees the merged values.
func TestDecodeConfigChecksTypesNotValues(t *testing.T) {
	raw, err := decodeConfig([]byte(`{"plugin_log_level":"loud","pod_lookup":{"retries":-3}}`))
	if err != nil {
		t.Fatalf("decode rejected a well-typed config: %v", err)
	}
	if *raw.PluginLogLevel != "loud" || *raw.PodLookup.Retries != -3 {
		t.Errorf("decoded %+v", raw)
	}
}

func TestWithDefaultsRecordsWhichKeyWasUsed(t *testing.T) {
	for _, tc := range []struct {
		name, json, field, wantKey string
	}{
		{"current log level", `{"plugin_log_level":"x","log_level":"y"}`, "LogLevel", "plugin_log_level"},
		{"legacy log level", `{"log_level":"y"}`, "LogLevel", "log_level"},
		{"legacy log level beside an empty current one", `{"plugin_log_level":"","log_level":"y"}`, "LogLevel", "log_level"},
		{"default log level", `{}`, "LogLevel", ""},
		{"kubeconfig from run dir", `{"cni_agent_run_dir":"/r","kubernetes":{"kubeconfig":"/k"}}`, "Kubeconfig", "cni_agent_run_dir"},
		{"legacy kubeconfig", `{"kubernetes":{"kubeconfig":"/k"}}`, "Kubeconfig", "kubernetes.kubeconfig"},
		{"legacy namespaces", `{"kubernetes":{"exclude_namespaces":["a"]}}`, "ExcludeNamespaces", "kubernetes.exclude_namespaces"},
		{"legacy socket", `{"log_uds_address":"/s"}`, "LogSocket", "log_uds_address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := decodeConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			c := raw.withDefaults()
			if got := c.keys[tc.field]; got != tc.wantKey {
				t.Errorf("key of %s = %q, want %q", tc.field, got, tc.wantKey)
			}
		})
	}
}

func TestValidateAcceptsTheDefaults(t *testing.T) {
	c := defaults()
	if err := c.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
}

func TestExtraBypassUIDsAreBounded(t *testing.T) {
	c := defaults()
	for i := range MaxExtraBypassUIDs + 1 {
		c.ExtraBypassUIDs = append(c.ExtraBypassUIDs, uint32(1000+i))
	}
	want := `plugin config: "extra_bypass_uids": 65 uids given, at most 64 are supported`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate = %v, want %s", err, want)
	}
}

// TestPodLookupIsRefusedOverItsBoundWhateverTheProduct: retries x interval over
// MaxPodLookupBound is refused naming pod_lookup and both values, also where the
// product does not fit a time.Duration (it wrapped to a negative bound, which
// Bound lifted to one request's timeout: the limit was bypassed); Bound never
// wraps either.
func TestPodLookupIsRefusedOverItsBoundWhateverTheProduct(t *testing.T) {
	for _, tc := range []struct {
		lookup string
		want   string // the error; "" when accepted
	}{
		{`{"retries":60,"interval":"1s"}`, ""},
		{`{"retries":120,"interval":"500ms"}`, ""},
		{`{"retries":61,"interval":"1s"}`,
			`plugin config: "pod_lookup": retries 61 x interval 1s is more than the limit of 1m0s`},
		{`{"retries":1,"interval":"1000000h"}`,
			`plugin config: "pod_lookup": retries 1 x interval 1000000h0m0s is more than the limit of 1m0s`},
		{`{"retries":3,"interval":"1000000h"}`, // 3 x 3.6e18 ns: past the largest Duration
			`plugin config: "pod_lookup": retries 3 x interval 1000000h0m0s is more than the limit of 1m0s`},
		{`{"retries":10000000000,"interval":"1s"}`, // 1e10 x 1e9 ns
			`plugin config: "pod_lookup": retries 10000000000 x interval 1s is more than the limit of 1m0s`},
		{`{"retries":9223372036854775807,"interval":"1ns"}`,
			`plugin config: "pod_lookup": retries 9223372036854775807 x interval 1ns is more than the limit of 1m0s`},
	} {
		t.Run(tc.lookup, func(t *testing.T) {
			_, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"istio-cni","pod_lookup":` + tc.lookup + `}`))
			got := "none"
			if err != nil {
				got = err.Error()
			}
			if want := tc.want; got != want && (want != "" || got != "none") {
				t.Errorf("error:\n got %s\nwant %s", got, want)
			}
		})
	}
	for _, l := range []PodLookup{{Retries: 3, Interval: 1000000 * time.Hour}, {Retries: 1e10, Interval: time.Second}} {
		if b := l.Bound(); b < MaxPodLookupBound {
			t.Errorf("%+v: Bound() = %s, want at least %s", l, b, MaxPodLookupBound)
		}
	}
}

func TestPrevResultIPsReadsEveryVersion(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       []netip.Addr
	}{
		{"standalone, no prevResult", `{"cniVersion":"1.0.0"}`, nil},
		{"1.0.0 dual stack", `{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0",
			"interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],
			"ips":[{"interface":0,"address":"10.1.0.5/24"},{"interface":0,"address":"fd00::5/64"}]}}`,
			[]netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5")}},
		{"0.3.1 IPv6 only", `{"cniVersion":"0.3.1","prevResult":{"cniVersion":"0.3.1",
			"ips":[{"version":"6","address":"fd00::7/64"}]}}`,
			[]netip.Addr{netip.MustParseAddr("fd00::7")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Alone, and after the result ADD prints was parsed (ADD's order): the
			// CNI library's parse empties the raw prevResult, and reading the raw
			// form after it once found no addresses.
			for _, resultFirst := range []bool{false, true} {
				c, err := ParseConfig([]byte(tc.json))
				if err != nil {
					t.Fatal(err)
				}
				if resultFirst {
					if _, err := result(c); err != nil {
						t.Fatal(err)
					}
				}
				got, err := c.PrevResultIPs()
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
					t.Errorf("result parsed first: %v: IPs (-want +got):\n%s", resultFirst, diff)
				}
			}
		})
	}
}

// TestPrevResultIPsAgreesWithTheCNILibrary: the addresses PrevResultIPs reads from
// the result as given are the ones the CNI library's parse of it holds, for
// every version the plugin speaks and for results it refuses.
func TestPrevResultIPsAgreesWithTheCNILibrary(t *testing.T) {
	results := []string{
		`{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0},{"address":"fd00::5/64"}]}`,
		`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":0,"address":"10.1.0.5/32"}],"routes":[{"dst":"0.0.0.0/0"}]}`,
		`{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.2.0.9/16"}],"dns":{}}`,
		`{"cniVersion":"0.3.1","ips":[{"version":"6","address":"fd00::7/64"}]}`,
		`{"cniVersion":"0.3.0","ips":[{"version":"4","address":"192.168.1.1/24"},{"version":"6","address":"::ffff:10.0.0.1/120"}]}`,
		`{"cniVersion":"1.1.0","ips":[{"address":"::ffff:10.0.0.1/120"}]}`, `{"cniVersion":"1.1.0","ips":[null]}`,
		`{"cniVersion":"1.1.0","ips":[{"address":null}]}`,
		`{"cniVersion":"1.0.0","ips":[]}`, `{"cniVersion":"1.0.0","ips":null}`, `{"cniVersion":"1.0.0"}`,
		`{"cniVersion":"1.0.0","ips":[{"interface":0}]}`, `{"cniVersion":"1.0.0","IPS":[{"ADDRESS":"10.0.0.1/8"}]}`,
		`{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/8"}],"ips":[{"address":"10.0.0.2/8"}]}`,
		// refused by both
		`{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}`, `{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1"}]}`,
		`{"cniVersion":"1.0.0","ips":[{"address":"010.0.0.1/8"}]}`, `{"cniVersion":"1.0.0","ips":[{"address":7}]}`,
		`{"cniVersion":"1.0.0","ips":{"address":"10.0.0.1/8"}}`, `{"cniVersion":"1.0.0","ips":["10.0.0.1/8"]}`,
	}
	for _, res := range results {
		for _, cfgVersion := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			data := []byte(`{"cniVersion":"` + cfgVersion + `","name":"n","prevResult":` + res + `}`)
			c, err := ParseConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			lib, _ := ParseConfig(data)
			got, gotErr := c.PrevResultIPs()
			want, wantErr := lib.prevResultIPsFromLibrary()
			if (gotErr == nil) != (wantErr == nil) {
				t.Errorf("config %s, result %s: error %v, the library's %v", cfgVersion, res, gotErr, wantErr)
				continue
			}
			if gotErr != nil && !strings.Contains(gotErr.Error(), "prevResult") {
				t.Errorf("config %s, result %s: error %v does not name prevResult", cfgVersion, res, gotErr)
			}
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("config %s, result %s: IPs (-library +PrevResultIPs):\n%s", cfgVersion, res, diff)
			}
		}
	}
}

func TestPrevResultIPsNamesPrevResultOnError(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","prevResult":{"ips":[{"address":"nope"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PrevResultIPs(); err == nil || !contains(err.Error(), "prevResult") {
		t.Errorf("PrevResultIPs = %v, want an error naming prevResult", err)
	}
	// The error stays: a second reader (ADD prints the result after reading the
	// addresses) must not see an emptied prevResult as "standalone".
	if _, err := result(c); err == nil || !strings.Contains(err.Error(), "prevResult") {
		t.Errorf("result after a failed parse = %v, want the prevResult error again", err)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub))
}

// TestConfigSchemaFailsClosedOnANewerConfig: adjacent versions. A config of this
// binary's schema or older (the key absent: Istio's entries, earlier agents') reads
// as before; a newer one is refused with ErrNewerConfig, before any other check, so
// that a key a newer agent added is never silently ignored.
func TestConfigSchemaFailsClosedOnANewerConfig(t *testing.T) {
	base := `"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","exclude_namespaces":["istio-system"]`
	without, err := ParseConfig([]byte(`{` + base + `}`))
	if err != nil {
		t.Fatal(err)
	}
	with, err := ParseConfig([]byte(fmt.Sprintf(`{%s,"config_schema":%d}`, base, ConfigSchema)))
	if err != nil {
		t.Fatalf("this binary's own schema: %v", err)
	}
	if diff := cmp.Diff(without, with, ignoreKeys); diff != "" {
		t.Errorf("config_schema changed what the config says (-without +with):\n%s", diff)
	}
	for _, tc := range []struct {
		name, json string
		newer      bool
		want       string
	}{
		{"a newer schema", fmt.Sprintf(`{%s,"config_schema":%d,"some_new_capture_key":true}`, base, ConfigSchema+1), true,
			fmt.Sprintf(`"config_schema" is %d, this istio-cni binary understands up to %d`, ConfigSchema+1, ConfigSchema)},
		{"a newer schema that changed a key's type", fmt.Sprintf(`{%s,"config_schema":%d,"exclude_namespaces":{"istio-system":{}}}`, base, ConfigSchema+1), true,
			"understands up to"},
		{"not a version", `{` + base + `,"config_schema":0}`, false, `"config_schema": 0 is not a schema version`},
		{"not a number", `{` + base + `,"config_schema":"2"}`, false, `"config_schema": got string, want an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfig: %v, want an error with %q", err, tc.want)
			}
			if got := errors.Is(err, ErrNewerConfig); got != tc.newer {
				t.Errorf("errors.Is(err, ErrNewerConfig) = %v, want %v", got, tc.newer)
			}
		})
	}
}

// TestADDPrintsThePreviousResult: the previous result of the config's version is
// printed byte for byte as the runtime gave it (a field this plugin does not know
// included); one of another version is converted to the config's version; a
// standalone ADD prints an empty result of the implemented version. ADD prints
// a result of the config's version as given without parsing it (printResult);
// the others go through the CNI library, and print the same through either.
func TestADDPrintsThePreviousResult(t *testing.T) {
	given := `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],` +
		`"ips":[{"interface":0,"address":"10.1.0.5/24","gateway":"10.1.0.1"}],"dns":{},"x-vendor":{"k":1}}`
	printers := map[string]func(p *Plugin, c *Config) error{
		"as ADD prints it": func(p *Plugin, c *Config) error {
			if _, err := c.PrevResultIPs(); err != nil { // ADD's order, for a pod it redirects
				return err
			}
			return p.printResult(c)
		},
		"parsed by the CNI library": func(p *Plugin, c *Config) error {
			r, err := result(c)
			if err != nil {
				return err
			}
			return p.print(c, r)
		},
	}
	for _, tc := range []struct {
		name, config string
		wantRaw      string         // printed as given
		want         map[string]any // or decoded, compared as JSON
		wantErr      string
	}{
		{name: "same version, as given", config: `{"cniVersion":"1.1.0","name":"n","prevResult":` + given + `}`, wantRaw: given},
		{name: "0.3.0 result in a 0.3.1 config, converted", config: `{"cniVersion":"0.3.1","name":"n","prevResult":{"cniVersion":"0.3.0",` +
			`"ips":[{"version":"4","address":"10.1.0.5/24"}],"dns":{}}}`,
			want: map[string]any{"cniVersion": "0.3.1", "ips": []any{map[string]any{"version": "4", "address": "10.1.0.5/24"}}, "dns": map[string]any{}}},
		{name: "standalone", config: `{"cniVersion":"1.0.0","name":"n"}`,
			want: map[string]any{"cniVersion": "1.0.0"}},
		{name: "a version that is not a string", config: `{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":1}}`,
			wantErr: "prevResult"},
	} {
		for pname, printResult := range printers {
			if tc.wantRaw != "" && pname != "as ADD prints it" {
				// The library drops the fields it does not know: ADD never
				// prints a result of the config's version through it.
				continue
			}
			t.Run(tc.name+"/"+pname, func(t *testing.T) {
				c, err := ParseConfig([]byte(tc.config))
				if err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				err = printResult(&Plugin{Stdout: &out}, c)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("printed %q, error %v; want an error naming %s", out.String(), err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if tc.wantRaw != "" {
					if out.String() != tc.wantRaw {
						t.Errorf("printed\n%s\nwant as given\n%s", out.String(), tc.wantRaw)
					}
					return
				}
				var got map[string]any
				if err := json.Unmarshal(out.Bytes(), &got); err != nil {
					t.Fatalf("printed %q: %v", out.String(), err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("printed (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestAPreviousResultWithoutItsVersionIsOfTheConfigsVersion: a previous result
// that does not name its cniVersion (results before 1.0.0 may leave it out, and
// runtimes before libcni 1.0 passed such a result on as it was) is of the
// config's version, as the CNI library's version.ParsePrevResult reads it: ADD,
// even of a pod it passes through, prints what the library would, and reads the
// addresses, where it failed on "unmarshalled CNIVersion is """.
func TestAPreviousResultWithoutItsVersionIsOfTheConfigsVersion(t *testing.T) {
	for _, v := range SupportedVersions.SupportedVersions() {
		for _, prev := range []string{
			`{"ips":[{"address":"10.1.0.5/24"}],"dns":{}}`,
			`{"cniVersion":null,"ips":[{"address":"10.1.0.5/24"}],"dns":{}}`,
		} {
			conf := []byte(`{"cniVersion":"` + v + `","name":"n","type":"istio-cni","prevResult":` + prev + `}`)
			var lib types.NetConf
			if err := json.Unmarshal(conf, &lib); err != nil {
				t.Fatal(err)
			}
			if err := version.ParsePrevResult(&lib); err != nil {
				t.Fatalf("config %s: the library refuses the previous result: %v", conf, err)
			}
			libResult, err := lib.PrevResult.GetAsVersion(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(libResult)
			if err != nil {
				t.Fatal(err)
			}

			c, err := ParseConfig(conf)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := (&Plugin{Stdout: &out}).printResult(c); err != nil {
				t.Errorf("config %s: ADD's result: %v, want the library's %s", conf, err, want)
			} else if diff := cmp.Diff(decodeJSONValue(t, want), decodeJSONValue(t, out.Bytes())); diff != "" {
				t.Errorf("config %s: printed (-library +ADD):\n%s", conf, diff)
			}

			c, err = ParseConfig(conf)
			if err != nil {
				t.Fatal(err)
			}
			ips, err := c.PrevResultIPs()
			if err != nil || len(ips) != 1 || ips[0] != netip.MustParseAddr("10.1.0.5") {
				t.Errorf("config %s: PrevResultIPs = %v, %v; want [10.1.0.5]", conf, ips, err)
			}
		}
	}
}

func decodeJSONValue(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return v
}

// TestNativeFallbacksAreLogged: a refusal the iptables backend recorded for the
// apply is a warning in the ADD's log, naming it.
func TestNativeFallbacksAreLogged(t *testing.T) {
	var buf bytes.Buffer
	log := pluginlog.New(&buf, pluginlog.Options{})
	warnRefused(log.Logger, []error{errors.New("ipv4 rules: the native write was refused, the restore wrote them: EINVAL")})
	log.Close()
	if got := buf.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "native write was refused") || !strings.Contains(got, "EINVAL") {
		t.Errorf("log = %q, want a warning naming the refusal", got)
	}
}

// TestStartErrIsLoggedAtDebug: a failure of the process's start (the timer
// slack's) is a debug line of every command, and nothing at the default level.
func TestStartErrIsLoggedAtDebug(t *testing.T) {
	for _, tc := range []struct {
		level    string
		startErr error
		want     bool
	}{
		{"debug", errors.New("timer slack left at the kernel's default: EPERM"), true},
		{"info", errors.New("timer slack left at the kernel's default: EPERM"), false},
		{"debug", nil, false},
	} {
		var stderr bytes.Buffer
		p := &Plugin{Stderr: &stderr, StartErr: tc.startErr}
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","log_level":%q,"cni_agent_run_dir":%q}`, tc.level, t.TempDir())
		_, log, err := p.setup(&cnicmd.CmdArgs{ContainerID: "c1", StdinData: []byte(conf)}, "ADD", nil)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		log.Close()
		got := strings.Contains(stderr.String(), "timer slack left at the kernel's default: EPERM")
		if got != tc.want || (got && !strings.Contains(stderr.String(), "level=DEBUG")) {
			t.Errorf("level %s, StartErr %v: logged %q, want the error at debug: %v", tc.level, tc.startErr, stderr.String(), tc.want)
		}
	}
}

// TestAnADDFailedOnThePreviousResultLeavesAnOutcomeRecord: an ADD that fails on
// the previous plugin's result (an address without its prefix length) leaves an
// "ADD failed" record for the pod in the plugin's log file, as every other failed
// ADD does: docs/troubleshooting.md reads no record at all as "the plugin did not
// run", and `istio-cni-doctor logs --pod` finds the ADD by that record.
func TestAnADDFailedOnThePreviousResultLeavesAnOutcomeRecord(t *testing.T) {
	for _, tc := range []struct {
		name, pod, prevResult string
	}{
		{"a pod looked up", "app/web", `{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5"}]}`},
		// Passed through before any lookup: the result of another version is
		// parsed only to be printed, and the ADD was logged as passed through.
		{"a pod passed through", "kube-system/coredns", `{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logFile := dir + "/istio-cni.log"
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":%q,"log_socket":"",`+
				`"exclude_namespaces":["kube-system"],"prevResult":%s}`, dir, logFile, tc.prevResult)
			ns, name, _ := strings.Cut(tc.pod, "/")
			p := &Plugin{Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Minute}
			err := p.Add(&cnicmd.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/gone", IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name + ";K8S_POD_UID=u1", StdinData: []byte(conf)})
			if err == nil || !strings.Contains(err.Error(), "prevResult") {
				t.Fatalf("ADD: %v, want it to fail on the previous result", err)
			}
			data, rerr := os.ReadFile(logFile)
			if rerr != nil {
				t.Fatal(rerr)
			}
			found := false
			for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				var rec struct{ Msg, Pod, Reason, Error string }
				if json.Unmarshal([]byte(line), &rec) != nil {
					continue
				}
				if rec.Msg == "ADD: pod passed through" {
					t.Errorf("the failed ADD is logged as passed through: %s", line)
				}
				if rec.Msg == "ADD failed" && rec.Pod == tc.pod && rec.Reason == pluginlog.ReasonPrevResult && strings.Contains(rec.Error, "10.1.0.5") {
					found = true
				}
			}
			if !found {
				t.Errorf("the log file holds no \"ADD failed\" record of pod %s with reason %s and the error; it holds:\n%s", tc.pod, pluginlog.ReasonPrevResult, data)
			}
		})
	}
}

// TestAnADDWithoutAnIptablesBackendNamesThePod: a pod to redirect on a node
// where the iptables backend cannot be set up (no iptables-save and
// iptables-restore of the flavour) fails its ADD with an error that names the
// pod, as the README says of every rule that cannot be applied.
func TestAnADDWithoutAnIptablesBackendNamesThePod(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", t.TempDir()) // no iptables binaries
	writeAgentPodFile(t, dir, injectedPod())
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":"","log_socket":"",`+
		`"iptables_mode":"legacy","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}}`, dir)
	p := &Plugin{Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Minute}
	err := p.Add(&cnicmd.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/gone", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_UID=uid-1", StdinData: []byte(conf)})
	if err == nil || !strings.Contains(err.Error(), "iptables-save") {
		t.Fatalf("ADD: %v, want it to fail for want of iptables-save", err)
	}
	if !strings.Contains(err.Error(), "pod default/web-1") {
		t.Errorf("ADD: %v, want an error naming pod default/web-1", err)
	}
}

// TestAFailedCHECKLeavesAnOutcomeRecord: a CHECK that fails before any rule is
// read (here on the previous plugin's result) leaves a "CHECK failed" record for
// the pod, as a failed ADD leaves an "ADD failed" one. Before, only a CHECK whose
// rules differed was logged.
func TestAFailedCHECKLeavesAnOutcomeRecord(t *testing.T) {
	dir := t.TempDir()
	logFile := dir + "/istio-cni.log"
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":%q,"log_socket":"",`+
		`"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5"}]}}`, dir, logFile)
	p := &Plugin{Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Minute}
	err := p.Check(&cnicmd.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/gone", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=app;K8S_POD_NAME=web;K8S_POD_UID=u1", StdinData: []byte(conf)})
	if err == nil || !strings.Contains(err.Error(), "prevResult") {
		t.Fatalf("CHECK: %v, want it to fail on the previous result", err)
	}
	data, rerr := os.ReadFile(logFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct{ Msg, Command, Error string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "CHECK failed" && rec.Command == "CHECK" && strings.Contains(rec.Error, "10.1.0.5") {
			return
		}
	}
	t.Errorf("the log file holds no \"CHECK failed\" record with the error; it holds:\n%s", data)
}

// TestAStandaloneADDWhoseNetnsIsGoneIsNotCountedAsPodSettings: a standalone ADD
// (no previous result) reads the families to capture from the pod's network
// namespace; when that namespace is gone (the runtime gave up on the sandbox
// while the ADD looked the pod up), the failure is the node's, not the pod's
// annotations': its outcome's reason (the "ADD failed" record and the report
// behind istio_cni_plugin_add_failures_total) is netns_gone, as for an apply
// whose namespace went away, not pod_settings.
func TestAStandaloneADDWhoseNetnsIsGoneIsNotCountedAsPodSettings(t *testing.T) {
	dir := t.TempDir()
	logFile := dir + "/istio-cni.log"
	writeAgentPodFile(t, dir, injectedPod())
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":%q,"log_socket":""}`, dir, logFile)
	p := &Plugin{Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Minute}
	err := p.Add(&cnicmd.CmdArgs{ContainerID: "c1", Netns: dir + "/netns-gone", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_UID=uid-1", StdinData: []byte(conf)})
	if err == nil || !strings.Contains(err.Error(), ErrNetnsUnreadable.Error()) {
		t.Fatalf("ADD: %v, want it to fail reading the addresses of the namespace", err)
	}
	// The runtime gets the error an apply into a namespace that went away gets: an
	// invalid variable, named as the spec asks of that code.
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(te.Msg, "CNI_NETNS "+dir+"/netns-gone") {
		t.Errorf("ADD: %#v, want code %d naming CNI_NETNS", err, types.ErrInvalidEnvironmentVariables)
	}
	data, rerr := os.ReadFile(logFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	var reasons []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct{ Msg, Pod, Reason string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "ADD failed" && rec.Pod == "default/web-1" {
			reasons = append(reasons, rec.Reason)
		}
	}
	if want := []string{pluginlog.ReasonNetnsGone}; !cmp.Equal(reasons, want) {
		t.Errorf("reasons of the \"ADD failed\" records = %q, want %q; the log file holds:\n%s", reasons, want, data)
	}
}

// TestInvalidConfigLogOptionsFindTheAgent: a config that does not parse still
// names the agent's sockets as far as their keys decode as absolute paths, so
// the agent logs the failure and counts it (reason config); else the defaults.
func TestInvalidConfigLogOptionsFindTheAgent(t *testing.T) {
	for _, tc := range []struct {
		name, conf, socket, datagram string
	}{
		{"no JSON", `{"cniVersion": `, "/var/run/istio-cni/pseq.sock", "/var/run/istio-cni/plog.sock"},
		{"run dir, bad elsewhere", `{"cni_agent_run_dir": "/run/x", "iptables_mode": 7}`, "/run/x/pseq.sock", "/run/x/plog.sock"},
		{"relative run dir", `{"cni_agent_run_dir": "run/x"}`, "/var/run/istio-cni/pseq.sock", "/var/run/istio-cni/plog.sock"},
		{"run dir of the wrong type", `{"cni_agent_run_dir": 7}`, "/var/run/istio-cni/pseq.sock", "/var/run/istio-cni/plog.sock"},
		{"log_socket wins", `{"log_socket": "/run/a.sock", "log_uds_address": "/run/b.sock"}`, "/run/a.sock", "/var/run/istio-cni/plog.sock"},
		{"legacy log_uds_address", `{"log_uds_address": "/run/b.sock", "kubernetes": 1}`, "/run/b.sock", "/var/run/istio-cni/plog.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := invalidConfigLogOptions([]byte(tc.conf))
			if o.Socket != tc.socket || o.DatagramSocket != tc.datagram || o.File != "" {
				t.Errorf("socket %q, datagram %q, file %q; want %q, %q and no file", o.Socket, o.DatagramSocket, o.File, tc.socket, tc.datagram)
			}
		})
	}
}

// writeAgentPodFile puts pod's file where the agent's pod cache keeps it in the
// run directory dir, in its format and kept (its lock held until the test ends),
// as the plugin reads it before anything else.
func writeAgentPodFile(t *testing.T, dir string, pod *kube.Pod) {
	t.Helper()
	data, err := json.Marshal(pod)
	if err == nil {
		data, err = kube.EncodeAgentPodFile(data)
	}
	if err != nil {
		t.Fatal(err)
	}
	files := dir + "/" + kube.AgentPodFilesDir
	path, _ := kube.AgentPodFile(files, pod.Metadata.Namespace, pod.Metadata.Name)
	keepAgentPodFiles(t, files)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// keepAgentPodFiles makes the pod files' directory files and holds its lock, as
// the agent keeping them does, until the test ends.
func keepAgentPodFiles(t *testing.T, files string) {
	t.Helper()
	if err := os.MkdirAll(files, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(files)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	release, err := kube.KeepAgentPodFiles(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}
