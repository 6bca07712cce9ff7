package agent

import (
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/nad"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/taint"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

func envOf(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

// minimalEnv is what Kubernetes gives every pod, plus the downward API's node name,
// pod name and namespace, which the default features (pod cache, repair, the exit
// decision) need.
var minimalEnv = map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "NODE_NAME": "node-0",
	"POD_NAME": "istio-cni-node-0", "POD_NAMESPACE": "kube-system"}

func withEnv(extra map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range minimalEnv {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

func defaults() Settings {
	s := Settings{
		MountedNetDir:       DefaultMountedNetDir,
		HostNetDir:          DefaultHostNetDir,
		MountedBinDir:       DefaultMountedBinDir,
		HostBinDir:          DefaultHostBinDir,
		BinSourceDir:        DefaultBinSourceDir,
		UpdateBinaries:      true,
		Chained:             true,
		PluginLogLevel:      cli.LevelInfo,
		KubeconfigMode:      0o600,
		ServiceAccountDir:   DefaultServiceAccountDir,
		KubeHost:            "10.96.0.1",
		KubePort:            443,
		KubeProtocol:        "https",
		RunDir:              "/var/run/istio-cni",
		MonitoringPort:      15014,
		ReadinessPort:       8000,
		RevertWarnCount:     DefaultRevertWarnCount,
		RevertWarnWindow:    DefaultRevertWarnWindow,
		LogLevel:            slog.LevelInfo,
		NodeName:            "node-0",
		PodCache:            true,
		NodeDirsRoot:        DefaultNodeDirsRoot,
		Repair:              repairDefaults("node-0"),
		Taint:               taint.DefaultConfig(),
		Multus:              nad.DefaultConfig(),
		PodName:             "istio-cni-node-0",
		PodNamespace:        "kube-system",
		UninstallOnExit:     ExitAuto,
		PluginTokenLifetime: DefaultPluginTokenLifetime,
	}
	s.Taint.Identity, s.Taint.AgentNamespace = "istio-cni-node-0", "kube-system"
	s.Multus.Identity, s.Multus.LeaseNamespace = "istio-cni-node-0", "kube-system"
	return s
}

func repairDefaults(node string) repair.Config {
	c := repair.DefaultConfig()
	c.NodeName, c.AgentNode = node, node
	return c
}

func TestParseReadsFlagsAndIstiosEnvironmentVariables(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want func(s *Settings)
	}{
		{
			name: "only the Kubernetes service variables gives Istio's defaults",
			want: func(s *Settings) {},
		},
		{
			name: "the Istio chart's configmap and daemonset variables",
			env: map[string]string{
				"CNI_CONF_NAME": "10-calico.conflist", "CHAINED_CNI_PLUGIN": "true",
				"EXCLUDED_NAMESPACES": "kube-system,istio-system", "POD_NAMESPACE": "istio-system",
				"NODE_NAME": "node-1", "CNI_AGENT_RUN_DIR": "/var/run/istio-cni", "MONITORING_PORT": "15014",
			},
			want: func(s *Settings) {
				s.ConfName = "10-calico.conflist"
				s.ExcludeNamespaces = []string{"kube-system", "istio-system"}
				s.PodNamespace = "istio-system"
				s.NodeName = "node-1"
				s.Repair.NodeName, s.Repair.AgentNode = "node-1", "node-1"
				s.Taint.AgentNamespace, s.Multus.LeaseNamespace = "istio-system", "istio-system"
			},
		},
		{
			name: "every variable",
			env: map[string]string{
				"MOUNTED_CNI_NET_DIR": "/m/net.d", "CNI_NET_DIR": "/h/net.d", "MOUNTED_CNI_BIN_DIR": "/m/bin",
				"CNI_BIN_DIR": "/h/bin", "SECONDARY_BIN_DIR": "/m/bin2", "CNI_BIN_SOURCE_DIR": "/image/bin",
				"CNI_BINARIES_PREFIX": "v2-3-", "SKIP_CNI_BINARIES": "istio-iptables", "UPDATE_CNI_BINARIES": "false", "CNI_CONF_GROUP_READ": "true",
				"CNI_CONF_NAME": "istio-cni.conf", "CHAINED_CNI_PLUGIN": "false", "CNI_NETWORK_CONFIG": `{"type":"v2-3-istio-cni"}`,
				"EXCLUDE_NAMESPACES": "a, b ,a", "PLUGIN_LOG_LEVEL": "DEBUG", "POD_NAMESPACE": "istio-cni",
				"NATIVE_NFTABLES": "true", "IPTABLES_MODE": "legacy", "KUBECONFIG_MODE": "0640",
				"SERVICE_ACCOUNT_DIR": "/sa", "KUBE_CA_FILE": "/ca/ca.pem", "SKIP_TLS_VERIFY": "1",
				"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443", "KUBERNETES_SERVICE_PROTOCOL": "HTTP",
				"KUBERNETES_NODE_NAME": "n", "CNI_AGENT_RUN_DIR": "/run/x", "MONITORING_PORT": "0", "READINESS_PORT": "9000",
				"REVERT_WARN_COUNT": "3", "REVERT_WARN_WINDOW": "30s", "AGENT_LOG_LEVEL": "debug", "AGENT_LOG_AS_JSON": "true",
				"NODE_DIRS_ROOT": "/nodefs",
			},
			want: func(s *Settings) {
				s.NodeDirsRoot = "/nodefs"
				s.MountedNetDir, s.HostNetDir, s.MountedBinDir, s.HostBinDir = "/m/net.d", "/h/net.d", "/m/bin", "/h/bin"
				s.SecondaryBinDir, s.BinSourceDir, s.BinariesPrefix = "/m/bin2", "/image/bin", "v2-3-"
				s.SkipBinaries, s.UpdateBinaries = []string{"istio-iptables"}, false
				s.ConfName, s.Chained, s.NetworkConfig, s.ConfGroupRead = "istio-cni.conf", false, `{"type":"v2-3-istio-cni"}`, true
				s.ExcludeNamespaces, s.PluginLogLevel, s.PodNamespace = []string{"a", "b"}, cli.LevelDebug, "istio-cni"
				s.NativeNftables, s.IptablesMode, s.KubeconfigMode = true, iptables.ModeLegacy, 0o640
				s.ServiceAccountDir, s.KubeCAFile, s.SkipTLSVerify = "/sa", "/ca/ca.pem", true
				s.KubeHost, s.KubePort, s.KubeProtocol, s.NodeName = "fd00::1", 6443, "http", "n"
				s.RunDir, s.MonitoringPort, s.ReadinessPort = "/run/x", 0, 9000
				s.RevertWarnCount, s.RevertWarnWindow = 3, 30*time.Second
				s.LogLevel, s.LogJSON = slog.LevelDebug, true
				s.Repair.NodeName, s.Repair.AgentNode, s.Taint.AgentNamespace, s.Multus.LeaseNamespace = "n", "n", "istio-cni", "istio-cni"
			},
		},
		{
			name: "a flag wins over its variable",
			args: []string{"--cni-conf-name=05-cilium.conflist", "--kubeconfig-mode", "0o400", "--chained-cni-plugin=false", "--cni-conf-name", "istio.conf"},
			env:  map[string]string{"CNI_CONF_NAME": "10-calico.conflist", "KUBECONFIG_MODE": "0644", "CHAINED_CNI_PLUGIN": "true"},
			want: func(s *Settings) {
				s.ConfName, s.KubeconfigMode, s.Chained = "istio.conf", 0o400, false
			},
		},
		{
			name: "PLUGIN_LOG_LEVEL wins over the older LOG_LEVEL, which still works alone",
			env:  map[string]string{"LOG_LEVEL": "warn", "PLUGIN_LOG_LEVEL": "error"},
			want: func(s *Settings) { s.PluginLogLevel = cli.LevelError },
		},
		{
			name: "LOG_LEVEL alone sets the plugin's level",
			env:  map[string]string{"LOG_LEVEL": "warn"},
			want: func(s *Settings) { s.PluginLogLevel = cli.LevelWarn },
		},
		{
			name: "an empty variable counts as unset",
			env:  map[string]string{"CNI_NET_DIR": "", "MONITORING_PORT": " "},
			want: func(s *Settings) {},
		},
		{
			name: "Istio's --log_output_level scope form",
			args: []string{"--log_output_level=cni:debug,default:warn", "--log_as_json"},
			want: func(s *Settings) { s.LogLevel, s.LogJSON = slog.LevelWarn, true },
		},
		{
			name: "no node name is fine with every feature that watches this node's pods off",
			env:  map[string]string{"NODE_NAME": "", "POD_CACHE_ENABLED": "false", "REPAIR_ENABLED": "false", "UNINSTALL_ON_EXIT": "never"},
			want: func(s *Settings) {
				s.NodeName, s.PodCache, s.UninstallOnExit = "", false, ExitNever
				s.Repair.Enabled, s.Repair.NodeName, s.Repair.AgentNode = false, "", ""
			},
		},
		{
			name: "the repair and taint variables reach their controllers, with the agent's node and namespace",
			args: []string{"--node-name=node-7", "--pod-cache=false"},
			env: map[string]string{
				"REPAIR_REPAIR_PODS": "false", "REPAIR_LABEL_PODS": "true", "REPAIR_BROKEN_POD_LABEL_KEY": "example.com/broken",
				"REPAIR_INIT_CONTAINER_NAME": "mesh-check", "TAINT_ENABLED": "true", "TAINT_EFFECT": "PreferNoSchedule",
				"POD_NAME": "istio-cni-node-x1", "POD_NAMESPACE": "mesh",
			},
			want: func(s *Settings) {
				s.NodeName, s.PodCache, s.PodNamespace, s.PodName = "node-7", false, "mesh", "istio-cni-node-x1"
				s.Repair.NodeName, s.Repair.AgentNode, s.Repair.RepairPods, s.Repair.LabelPods = "node-7", "node-7", false, true
				s.Repair.LabelKey, s.Repair.InitContainerName = "example.com/broken", "mesh-check"
				s.Taint.Enabled, s.Taint.Effect, s.Taint.Identity, s.Taint.AgentNamespace = true, "PreferNoSchedule", "istio-cni-node-x1", "mesh"
				s.Multus.Identity, s.Multus.LeaseNamespace = "istio-cni-node-x1", "mesh"
			},
		},
		{
			name: "the multus variables reach the repair and NetworkAttachmentDefinition controllers",
			env: map[string]string{
				"CHAINED_CNI_PLUGIN": "false", "MULTUS_ENABLED": "true", "MULTUS_NETWORK_NAME": "mesh-cni",
				"MULTUS_MESHED_NAMESPACES": "true", "MULTUS_STATIC_NAMESPACES": "default,bookinfo",
				"MULTUS_NAD_OWNER_CLUSTERROLE": "istio-cni", "MULTUS_LEASE_NAME": "l", "MULTUS_RETRY_PERIOD": "4s",
				"POD_NAME": "istio-cni-node-x1", "POD_NAMESPACE": "kube-system",
			},
			want: func(s *Settings) {
				s.Chained, s.PodNamespace, s.PodName = false, "kube-system", "istio-cni-node-x1"
				s.Taint.Identity, s.Taint.AgentNamespace = "istio-cni-node-x1", "kube-system"
				s.Repair.MultusNetwork = "mesh-cni"
				s.Multus.Enabled, s.Multus.Network, s.Multus.MeshedNamespaces = true, "mesh-cni", true
				s.Multus.StaticNamespaces, s.Multus.OwnerClusterRole = []string{"default", "bookinfo"}, "istio-cni"
				s.Multus.LeaseName, s.Multus.RetryPeriod = "l", 4*time.Second
				s.Multus.Identity, s.Multus.LeaseNamespace = "istio-cni-node-x1", "kube-system"
			},
		},
		{
			name: "the exit decision and the plugin's own token",
			env: map[string]string{"UNINSTALL_ON_EXIT": "true", "PLUGIN_SERVICE_ACCOUNT": "istio-cni-plugin",
				"PLUGIN_TOKEN_LIFETIME": "2h"},
			want: func(s *Settings) {
				s.UninstallOnExit, s.PluginServiceAccount, s.PluginTokenLifetime = ExitAlways, "istio-cni-plugin", 2*time.Hour
			},
		},
		{
			name: "bind addresses of the two servers",
			env:  map[string]string{"MONITORING_ADDRESS": " 10.0.0.5 ", "READINESS_ADDRESS": "::1"},
			want: func(s *Settings) {
				s.MonitoringAddress, s.ReadinessAddress = netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("::1")
			},
		},
		{
			name: "one server on one address when the ports are the same",
			env:  map[string]string{"MONITORING_PORT": "9000", "READINESS_PORT": "9000", "MONITORING_ADDRESS": "127.0.0.1", "READINESS_ADDRESS": "127.0.0.1"},
			want: func(s *Settings) {
				s.MonitoringPort, s.ReadinessPort = 9000, 9000
				s.MonitoringAddress, s.ReadinessAddress = netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1")
			},
		},
		{
			name: "Istio's cni-plugin scope sets the plugin's level, the default scope the agent's",
			args: []string{"--log_output_level=default:warn,cni-plugin:debug"},
			want: func(s *Settings) { s.LogLevel, s.PluginLogLevel = slog.LevelWarn, cli.LevelDebug },
		},
		{
			name: "Istio's cni-agent scope sets the agent's level, over the default scope",
			args: []string{"--log_output_level=default:info,cni-agent:debug"},
			want: func(s *Settings) { s.LogLevel = slog.LevelDebug },
		},
		{
			name: "Istio's all scope given after the default scope sets the agent's level",
			args: []string{"--log_output_level=default:warn,all:debug"},
			want: func(s *Settings) { s.LogLevel, s.PluginLogLevel = slog.LevelDebug, cli.LevelDebug },
		},
		{
			name: "the last of all and cni-agent wins, as in Istio's logging",
			args: []string{"--log_output_level=all:debug,cni-agent:error"},
			want: func(s *Settings) { s.LogLevel, s.PluginLogLevel = slog.LevelError, cli.LevelDebug },
		},
		{
			name: "the cni-plugin scope alone leaves the agent at info",
			env:  map[string]string{"AGENT_LOG_LEVEL": "cni-plugin:debug"},
			want: func(s *Settings) { s.PluginLogLevel = cli.LevelDebug },
		},
		{
			name: "Istio's all scope sets both",
			args: []string{"--log_output_level=all:error"},
			want: func(s *Settings) { s.LogLevel, s.PluginLogLevel = slog.LevelError, cli.LevelError },
		},
		{
			name: "the plugin's own level wins over the scope",
			args: []string{"--log_output_level=cni-plugin:debug"},
			env:  map[string]string{"LOG_LEVEL": "warn"},
			want: func(s *Settings) { s.PluginLogLevel = cli.LevelWarn },
		},
		{
			name: "kubeconfig modes with their leading 0",
			env:  map[string]string{"KUBECONFIG_MODE": "0o640"},
			want: func(s *Settings) { s.KubeconfigMode = 0o640 },
		},
		{
			name: "Istio-owned CNI config off",
			env:  map[string]string{"ISTIO_OWNED_CNI_CONFIG": "false", "ISTIO_OWNED_CNI_CONFIG_FILENAME": "02-istio-cni.conflist"},
			want: func(s *Settings) {},
		},
		{
			// Istio's install-cni writes its own copy of the chain only in ambient
			// mode; otherwise it inserts the entry into the primary's file, as here.
			name: "Istio-owned CNI config on, which Istio's install-cni honours in ambient mode only",
			env:  map[string]string{"ISTIO_OWNED_CNI_CONFIG": "true", "ISTIO_OWNED_CNI_CONFIG_FILENAME": "02-istio-cni.conflist"},
			want: func(s *Settings) {
				s.Notices = []string{"environment variable ISTIO_OWNED_CNI_CONFIG=true has no effect: " + istioSwitchesNotHere[1].why}
			},
		},
		{
			name: "REPAIR_ENABLED set but empty is false, as Istio reads it",
			env:  map[string]string{"REPAIR_ENABLED": " "},
			want: func(s *Settings) { s.Repair.Enabled = false },
		},
		{
			name: "a repair controller with every action off is not started, as Istio's does nothing",
			env:  map[string]string{"REPAIR_REPAIR_PODS": "", "REPAIR_DELETE_PODS": "false", "REPAIR_LABEL_PODS": "false"},
			want: func(s *Settings) {
				s.Repair.Enabled, s.Repair.Idle, s.Repair.RepairPods = false, true, false
				s.Notices = []string{"the repair controller is not started: REPAIR_ENABLED is true, but REPAIR_REPAIR_PODS, REPAIR_DELETE_PODS " +
					"and REPAIR_LABEL_PODS are all false, so it would do nothing with a broken pod (Istio's install-cni runs it and it does nothing); " +
					"turn one of them on for repair, or set REPAIR_ENABLED=false"}
			},
		},
		{
			name: "a bracketed IPv6 API server address",
			env:  map[string]string{"KUBERNETES_SERVICE_HOST": "[fd00::1]"},
			want: func(s *Settings) { s.KubeHost = "fd00::1" },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.args, envOf(withEnv(tc.env)))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := defaults()
			tc.want(&want)
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.IgnoreUnexported(Settings{})); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

// istio129ChartEnv is the environment Istio 1.29's istio-cni chart gives install-cni
// with its default values: its ConfigMap's variables (through envFrom) and the
// DaemonSet's own, downward API resolved. Its DaemonSet mounts the node's /proc at
// /host/proc (repair.repairPods), where Istio's install-cni reads it.
var istio129ChartEnv = map[string]string{
	"CURRENT_AGENT_VERSION": "1.29.1", "AMBIENT_ENABLED": "false", "AMBIENT_DNS_CAPTURE": "true", "AMBIENT_IPV6": "true",
	"AMBIENT_ENABLEMENT_SELECTOR": "- podSelector:\n    matchLabels:\n      istio.io/dataplane-mode: ambient\n", "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP": "true",
	"ENABLE_AMBIENT_DETECTION_RETRY": "false", "ISTIO_OWNED_CNI_CONFIG": "false", "CHAINED_CNI_PLUGIN": "true",
	"EXCLUDE_NAMESPACES": "kube-system", "REPAIR_ENABLED": "true", "REPAIR_LABEL_PODS": "false",
	"REPAIR_DELETE_PODS": "false", "REPAIR_REPAIR_PODS": "true", "REPAIR_INIT_CONTAINER_NAME": "istio-validation",
	"REPAIR_BROKEN_POD_LABEL_KEY": "cni.istio.io/uninitialized", "REPAIR_BROKEN_POD_LABEL_VALUE": "true",
	"NATIVE_NFTABLES": "false", "REPAIR_NODE_NAME": "node-0", "REPAIR_RUN_AS_DAEMON": "true",
	"REPAIR_SIDECAR_ANNOTATION": "sidecar.istio.io/status", "ALLOW_SWITCH_TO_HOST_NS": "true",
	"NODE_NAME": "node-0", "GOMEMLIMIT": "8221020160", "GOMAXPROCS": "2",
	"POD_NAME": "istio-cni-node-x1", "POD_NAMESPACE": "istio-system",
}

// TestParseGivesIstiosChartEnvironmentIstiosMeaning: install-cni run with the
// environment and arguments of Istio 1.29's chart does what Istio's install-cni does
// with them, down to where the repair in place looks for the node's processes.
func TestParseGivesIstiosChartEnvironmentIstiosMeaning(t *testing.T) {
	got, err := Parse([]string{"--log_output_level=info"}, envOf(withEnv(istio129ChartEnv)))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := defaults()
	want.ExcludeNamespaces = []string{"kube-system"}
	want.PodName, want.PodNamespace = "istio-cni-node-x1", "istio-system"
	want.Taint.Identity, want.Taint.AgentNamespace = "istio-cni-node-x1", "istio-system"
	want.Multus.Identity, want.Multus.LeaseNamespace = "istio-cni-node-x1", "istio-system"
	want.Repair.ProcDir = "/host/proc"
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.IgnoreUnexported(Settings{})); diff != "" {
		t.Errorf("settings (-Istio's meaning +got):\n%s", diff)
	}
}

func TestParseErrorsNameTheSettingAndTheValue(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string // every one must appear in the error
	}{
		{"ambient mode", nil, map[string]string{"AMBIENT_ENABLED": "true"}, []string{"AMBIENT_ENABLED=true", "no ambient mode"}},
		{"ambient switch not a bool", nil, map[string]string{"AMBIENT_ENABLED": "on"}, []string{"AMBIENT_ENABLED", `"on"`}},
		{"relative conf dir", nil, map[string]string{"MOUNTED_CNI_NET_DIR": "etc/cni"}, []string{"MOUNTED_CNI_NET_DIR", `"etc/cni"`, "absolute"}},
		{"relative dir by flag", []string{"--cni-agent-run-dir=run"}, nil, []string{"--cni-agent-run-dir", `"run"`}},
		{"relative node dirs root", nil, map[string]string{"NODE_DIRS_ROOT": "host"}, []string{"NODE_DIRS_ROOT", `"host"`, "absolute"}},
		{"chained not a bool", nil, map[string]string{"CHAINED_CNI_PLUGIN": "yes please"}, []string{"CHAINED_CNI_PLUGIN", `"yes please"`}},
		{"Istio-owned switch not a bool", nil, map[string]string{"ISTIO_OWNED_CNI_CONFIG": "yes"}, []string{"ISTIO_OWNED_CNI_CONFIG", `"yes"`}},
		{"kubeconfig mode not octal", nil, map[string]string{"KUBECONFIG_MODE": "0999"}, []string{"KUBECONFIG_MODE", `"0999"`, "octal"}},
		{"kubeconfig mode without its leading 0", nil, map[string]string{"KUBECONFIG_MODE": "420"}, []string{"KUBECONFIG_MODE", `"420"`, "leading 0", "0420", "decimal"}},
		{"kubeconfig mode 600", []string{"--kubeconfig-mode=600"}, nil, []string{"--kubeconfig-mode", `"600"`, "leading 0"}},
		{"kubeconfig mode too large", nil, map[string]string{"KUBECONFIG_MODE": "07777"}, []string{"KUBECONFIG_MODE", `"07777"`}},
		{"kubeconfig mode unreadable", nil, map[string]string{"KUBECONFIG_MODE": "0200"}, []string{"KUBECONFIG_MODE", `"0200"`, "could not read"}},
		{"a bad level of the plugin's scope", []string{"--log_output_level=default:info,cni-plugin:loud"}, nil, []string{"--log_output_level", "cni-plugin:loud"}},
		{"monitoring port", nil, map[string]string{"MONITORING_PORT": "70000"}, []string{"MONITORING_PORT", `"70000"`, "port"}},
		{"api port zero", nil, map[string]string{"KUBERNETES_SERVICE_PORT": "0"}, []string{"KUBERNETES_SERVICE_PORT", `"0"`}},
		{"api host", nil, map[string]string{"KUBERNETES_SERVICE_HOST": "https://10.0.0.1"}, []string{"KUBERNETES_SERVICE_HOST", `"https://10.0.0.1"`}},
		{"no api host", nil, map[string]string{"KUBERNETES_SERVICE_HOST": ""}, []string{"KUBERNETES_SERVICE_HOST", "not set"}},
		{"protocol", nil, map[string]string{"KUBERNETES_SERVICE_PROTOCOL": "ftp"}, []string{"KUBERNETES_SERVICE_PROTOCOL", `"ftp"`}},
		{"namespace", nil, map[string]string{"EXCLUDE_NAMESPACES": "kube-system,Istio_System"}, []string{"EXCLUDE_NAMESPACES", `"Istio_System"`, "namespace"}},
		{"older namespace variable", nil, map[string]string{"EXCLUDED_NAMESPACES": "-x"}, []string{"EXCLUDED_NAMESPACES", `"-x"`}},
		{"pod namespace", nil, map[string]string{"POD_NAMESPACE": "a.b"}, []string{"POD_NAMESPACE", `"a.b"`}},
		{"plugin log level", nil, map[string]string{"PLUGIN_LOG_LEVEL": "verbose"}, []string{"PLUGIN_LOG_LEVEL", `"verbose"`, "log level"}},
		{"conf name with a path", nil, map[string]string{"CNI_CONF_NAME": "../10-calico.conflist"}, []string{"CNI_CONF_NAME", `"../10-calico.conflist"`}},
		{"conf name extension", nil, map[string]string{"CNI_CONF_NAME": "10-calico.yaml"}, []string{"CNI_CONF_NAME", `"10-calico.yaml"`, ".conflist"}},
		{"standalone conflist", nil, map[string]string{"CHAINED_CNI_PLUGIN": "false", "CNI_CONF_NAME": "istio.conflist"}, []string{"CNI_CONF_NAME", `"istio.conflist"`, "standalone"}},
		{"prefix with a slash", nil, map[string]string{"CNI_BINARIES_PREFIX": "a/b-"}, []string{"CNI_BINARIES_PREFIX", `"a/b-"`}},
		{"skip a path", nil, map[string]string{"SKIP_CNI_BINARIES": "istio-cni,../x"}, []string{"SKIP_CNI_BINARIES", `"../x"`}},
		{"iptables mode", nil, map[string]string{"IPTABLES_MODE": "xtables"}, []string{"IPTABLES_MODE", `"xtables"`}},
		{"revert window", nil, map[string]string{"REVERT_WARN_WINDOW": "-1s"}, []string{"REVERT_WARN_WINDOW", `"-1s"`}},
		{"revert count", nil, map[string]string{"REVERT_WARN_COUNT": "0"}, []string{"REVERT_WARN_COUNT", `"0"`}},
		{"agent log level", []string{"--log_output_level=chatty"}, nil, []string{"--log_output_level", `"chatty"`}},
		{"both templates", nil, map[string]string{"CNI_NETWORK_CONFIG": "{}", "CNI_NETWORK_CONFIG_FILE": "/t.json"}, []string{"CNI_NETWORK_CONFIG", "CNI_NETWORK_CONFIG_FILE", `"/t.json"`}},
		{"run dir too long for its sockets", nil, map[string]string{"CNI_AGENT_RUN_DIR": "/var/run/" + strings.Repeat("d", 90)},
			[]string{"CNI_AGENT_RUN_DIR", `"/var/run/` + strings.Repeat("d", 90) + `"`, "too long", "over the 107"}},
		{"run dir is the conf dir", nil, map[string]string{"CNI_AGENT_RUN_DIR": "/host/etc/cni/net.d"}, []string{"CNI_AGENT_RUN_DIR", `"/host/etc/cni/net.d"`}},
		{"bin dir is the source", nil, map[string]string{"MOUNTED_CNI_BIN_DIR": "/opt/cni/bin"}, []string{"MOUNTED_CNI_BIN_DIR", `"/opt/cni/bin"`, "onto themselves"}},
		{"unknown flag", []string{"--cni-conf-dir=/x"}, nil, []string{"cni-conf-dir"}},
		{"stray argument", []string{"install"}, nil, []string{`"install"`}},
		{"pod cache not a bool", nil, map[string]string{"POD_CACHE_ENABLED": "sure"}, []string{"POD_CACHE_ENABLED", `"sure"`}},
		{"no node name for the pod cache", nil, map[string]string{"NODE_NAME": "", "REPAIR_ENABLED": "false"}, []string{"NODE_NAME", "POD_CACHE_ENABLED"}},
		{"no node name for repair", nil, map[string]string{"NODE_NAME": "", "POD_CACHE_ENABLED": "false"}, []string{"REPAIR_NODE_NAME", "NODE_NAME"}},
		{"repair exit code", nil, map[string]string{"REPAIR_INIT_CONTAINER_EXIT_CODE": "300"}, []string{"REPAIR_INIT_CONTAINER_EXIT_CODE", "300"}},
		{"chained switch not a bool", nil, map[string]string{"CHAINED_CNI_PLUGIN": "on"}, []string{"CHAINED_CNI_PLUGIN", `"on"`}},
		// Istio's install-cni reads it as false, a standalone config no runtime
		// without Multus runs: neither reading is a guess to make.
		{"chained switch set but empty", nil, map[string]string{"CHAINED_CNI_PLUGIN": ""}, []string{"CHAINED_CNI_PLUGIN", `""`, "set but empty", "without Multus"}},
		{"chained switch blank", nil, map[string]string{"CHAINED_CNI_PLUGIN": " "}, []string{"CHAINED_CNI_PLUGIN", `" "`, "set but empty"}},
		// Istio's install-cni reads " true" as false: neither reading is taken.
		{"Istio switch with spaces", nil, map[string]string{"SKIP_TLS_VERIFY": " true"}, []string{"SKIP_TLS_VERIFY", `" true"`, "reads it as false"}},
		{"Istio switch with a newline", nil, map[string]string{"NATIVE_NFTABLES": "true\n"}, []string{"NATIVE_NFTABLES", `"true\n"`, "reads it as false"}},
		{"repair switch not a bool", nil, map[string]string{"REPAIR_REPAIR_PODS": "yes"}, []string{"REPAIR_REPAIR_PODS", `"yes"`}},
		{"taint without a pod name", nil, map[string]string{"TAINT_ENABLED": "true", "POD_NAME": "", "UNINSTALL_ON_EXIT": "never"}, []string{"TAINT_IDENTITY", "POD_NAME"}},
		{"exit decision without the downward API", nil, map[string]string{"POD_NAME": "", "POD_NAMESPACE": ""}, []string{"UNINSTALL_ON_EXIT=auto", "POD_NAME, POD_NAMESPACE are not set", "always or never"}},
		{"exit mode", nil, map[string]string{"UNINSTALL_ON_EXIT": "sometimes"}, []string{"UNINSTALL_ON_EXIT", `"sometimes"`, "auto, always or never"}},
		{"plugin service account name", nil, map[string]string{"PLUGIN_SERVICE_ACCOUNT": "Istio CNI"}, []string{"PLUGIN_SERVICE_ACCOUNT", `"Istio CNI"`}},
		{"plugin token lifetime too short", nil, map[string]string{"PLUGIN_TOKEN_LIFETIME": "5m"}, []string{"PLUGIN_TOKEN_LIFETIME", "5m0s", "10m0s"}},
		{"plugin token lifetime not a duration", nil, map[string]string{"PLUGIN_TOKEN_LIFETIME": "1 day"}, []string{"PLUGIN_TOKEN_LIFETIME", `"1 day"`}},
		{"taint effect", nil, map[string]string{"TAINT_ENABLED": "true", "POD_NAME": "p", "TAINT_EFFECT": "Never"}, []string{"TAINT_EFFECT", `"Never"`}},
		{"multus when chained", nil, map[string]string{"MULTUS_ENABLED": "true"}, []string{"MULTUS_ENABLED", "CHAINED_CNI_PLUGIN"}},
		{"multus network name", nil, map[string]string{"CHAINED_CNI_PLUGIN": "false", "MULTUS_ENABLED": "true", "MULTUS_NETWORK_NAME": "Mesh CNI"},
			[]string{"MULTUS_NETWORK_NAME", `"Mesh CNI"`}},
		{"multus namespaces without a pod name", nil, map[string]string{"CHAINED_CNI_PLUGIN": "false", "MULTUS_ENABLED": "true",
			"MULTUS_MESHED_NAMESPACES": "true", "POD_NAMESPACE": "kube-system", "POD_NAME": "", "UNINSTALL_ON_EXIT": "never"}, []string{"MULTUS_IDENTITY", "POD_NAME"}},
		{"bind address not an IP", nil, map[string]string{"MONITORING_ADDRESS": "node-a"}, []string{"MONITORING_ADDRESS", `"node-a"`, "not an IP address"}},
		{"bind address with a zone", []string{"--readiness-address=fe80::1%eth0"}, nil, []string{"--readiness-address", `"fe80::1%eth0"`}},
		{"one port on two addresses", nil, map[string]string{"MONITORING_PORT": "9000", "READINESS_PORT": "9000", "READINESS_ADDRESS": "127.0.0.1"},
			[]string{"MONITORING_PORT and READINESS_PORT are both 9000", `READINESS_ADDRESS "127.0.0.1"`}},
		{"every bad value is reported", nil, map[string]string{"MONITORING_PORT": "x", "READINESS_PORT": "y"}, []string{"MONITORING_PORT", `"x"`, "READINESS_PORT", `"y"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args, envOf(withEnv(tc.env)))
			wanterr.Mentions(t, err, tc.want...)
		})
	}
}

func TestParseHelpIsNotAnErrorAndListsEveryVariable(t *testing.T) {
	if _, err := Parse([]string{"--help"}, envOf(nil)); !errors.Is(err, ErrHelp) {
		t.Fatalf("Parse(--help) = %v, want ErrHelp", err)
	}
	u := Usage()
	for _, s := range table.Settings {
		for _, e := range s.Envs {
			if !strings.Contains(u, e) {
				t.Errorf("usage does not mention %s", e)
			}
		}
	}
}

// TestReadmeDocumentsEverySetting keeps the README's table in step with the code.
func TestReadmeDocumentsEverySetting(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range table.Settings {
		if !strings.Contains(string(readme), "`--"+s.Name+"`") {
			t.Errorf("README.md does not document --%s", s.Name)
		}
		for _, e := range s.Envs {
			if !strings.Contains(string(readme), "`"+e+"`") {
				t.Errorf("README.md does not document %s", e)
			}
		}
	}
}
