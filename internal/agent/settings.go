package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/internal/nad"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/settings"
	"github.com/istio-cni/istio-cni/internal/taint"
)

// Settings is everything the agent was asked to do, validated. Parse is the only way
// to get one; the zero value is not usable.
type Settings struct {
	// MountedNetDir is the node's CNI config directory as mounted in the agent's
	// container; HostNetDir is the same directory on the host (what the runtime reads).
	MountedNetDir string
	HostNetDir    string
	// MountedBinDir is the node's CNI binary directory as mounted in the container;
	// HostBinDir is the same directory on the host.
	MountedBinDir string
	HostBinDir    string
	// SecondaryBinDir, when set, receives the binaries too (Istio mounts a second
	// host directory for runtimes that look elsewhere, e.g. Multus or CRI-O).
	SecondaryBinDir string
	// BinSourceDir is the directory in the image holding the binaries to install.
	BinSourceDir string
	// BinariesPrefix is prepended to every installed binary's name (Maistra's
	// CNI_BINARIES_PREFIX), so two control planes can install side by side; the
	// entry's "type" names the prefixed plugin.
	BinariesPrefix string
	// SkipBinaries are names in BinSourceDir not to install.
	SkipBinaries []string
	// UpdateBinaries replaces an installed binary that differs from ours; when false
	// an existing file is left alone.
	UpdateBinaries bool

	// ConfName is the config file to edit (chained) or write (standalone); empty in
	// chained mode means the runtime's choice: the first valid file in lexical order.
	ConfName string
	// Chained inserts our entry into the primary CNI's chain; otherwise the agent
	// writes a config of its own (OpenShift / Multus).
	Chained bool
	// ConfGroupRead gives the standalone config group read (StandaloneConfMode).
	ConfGroupRead bool
	// NetworkConfig is a template of our plugin entry (CNI_NETWORK_CONFIG) with
	// __PLACEHOLDERS__; NetworkConfigFile names a file holding one. Both empty: the
	// agent builds the entry from the settings below.
	NetworkConfig     string
	NetworkConfigFile string

	ExcludeNamespaces []string
	PluginLogLevel    cli.Level
	PodNamespace      string
	NativeNftables    bool
	IptablesMode      iptables.Mode

	// KubeconfigMode is the plugin kubeconfig's file mode.
	KubeconfigMode os.FileMode
	// ServiceAccountDir holds the agent's token and ca.crt.
	ServiceAccountDir string
	// KubeCAFile is the CA written into the kubeconfig; default ServiceAccountDir/ca.crt.
	KubeCAFile    string
	SkipTLSVerify bool
	// KubeHost, KubePort and KubeProtocol form the API server URL the plugin uses
	// (Kubernetes' KUBERNETES_SERVICE_* variables).
	KubeHost     string
	KubePort     uint16
	KubeProtocol string
	NodeName     string

	// RunDir is the agent's directory on the node, at the same path in the container
	// and on the host: the plugin's kubeconfig and the log socket live there.
	RunDir string

	// MonitoringPort serves /metrics (and the probes); ReadinessPort serves /healthz
	// and /readyz. 0 picks a free port (logged); the same port serves everything.
	MonitoringPort uint16
	ReadinessPort  uint16
	// MonitoringAddress and ReadinessAddress are the addresses the two servers
	// listen on; unset (the zero Addr) is every address. With hostNetwork that is
	// every address of the node.
	MonitoringAddress netip.Addr
	ReadinessAddress  netip.Addr

	// RevertWarnCount and RevertWarnWindow: more re-inserts than RevertWarnCount
	// within RevertWarnWindow log a warning with a hint.
	RevertWarnCount  int
	RevertWarnWindow time.Duration

	// LogLevel and LogJSON configure the agent's own log (stderr).
	LogLevel slog.Level
	LogJSON  bool

	// PodCache serves this node's pods to the plugin over <RunDir>/pods.sock from a
	// watch of the node's pods (needs NodeName).
	PodCache bool
	// Repair and Taint are the repair and node readiness controllers' settings,
	// read from their own environment variables (Istio's REPAIR_* names, our
	// TAINT_*); NODE_NAME and POD_NAMESPACE come from the agent's settings above, so
	// --node-name and KUBERNETES_NODE_NAME count for them too.
	Repair repair.Config
	Taint  taint.Config
	// PodName is this agent's pod (POD_NAME, from the downward API).
	PodName string
	// NodeDirsRoot is where the node's /usr, /sbin and /bin are mounted at their
	// own paths, those of them that are (iptables.NodePathDirs): the node check
	// looks for the plugin's iptables tools there when the node's /proc
	// (Repair.ProcDir) does not show the node (plugin.NodeViewIn).
	NodeDirsRoot string
	// UninstallOnExit says what happens to the entry, the binaries and the kubeconfig
	// when the agent exits (see ExitMode): auto asks the API server whether another
	// agent will run on this node (needs PodName, PodNamespace and NodeName).
	UninstallOnExit ExitMode
	// PluginServiceAccount, when set, is the ServiceAccount (in PodNamespace) whose
	// token the plugin's kubeconfig carries, from the TokenRequest API and bound to
	// the node, renewed at half of PluginTokenLifetime. Empty: the agent's own
	// projected token, which the API server stops accepting once this agent's pod is
	// deleted.
	PluginServiceAccount string
	PluginTokenLifetime  time.Duration

	// Multus says pods join the plugin through Multus, and whether this agent
	// campaigns to keep the NetworkAttachmentDefinition in meshed namespaces
	// (MULTUS_*).
	Multus nad.Config

	// Notices are settings accepted that do nothing here, as they do nothing in
	// Istio's install-cni (ISTIO_OWNED_CNI_CONFIG=true outside ambient mode, a
	// repair controller with every action off), each saying so: the agent logs
	// them at start.
	Notices []string

	// given are the settings of templatedSettings that a flag or variable gives,
	// by flag name, each with where its value comes from and the value
	// (`environment variable EXCLUDE_NAMESPACES "a,b"`): a template's entry must
	// hold them (checkTemplateHolds).
	given map[string]string
}

// Defaults, Istio's where Istio has one.
const (
	DefaultMountedNetDir     = "/host/etc/cni/net.d"
	DefaultHostNetDir        = "/etc/cni/net.d"
	DefaultMountedBinDir     = "/host/opt/cni/bin"
	DefaultHostBinDir        = "/opt/cni/bin"
	DefaultBinSourceDir      = "/opt/cni/bin"
	DefaultStandaloneName    = "zz-istio-cni.conf"
	DefaultKubeconfigMode    = 0o600
	DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	DefaultMonitoringPort    = 15014
	DefaultReadinessPort     = 8000
	DefaultRevertWarnCount   = 5
	DefaultRevertWarnWindow  = time.Minute
	// DefaultNodeDirsRoot is where the chart mounts the node's
	// iptables.NodePathDirs read-only at their own paths (/host/usr, /host/sbin,
	// /host/bin), beside the CNI directories under /host.
	DefaultNodeDirsRoot = "/host"
	// PluginType is the plugin's binary name and the "type" of its entry, before
	// the binaries prefix.
	PluginType = "istio-cni"
)

// table is the agent's flags and their environment variables. Every setting takes
// its default through its Set, so a bad default fails as loudly as a bad flag.
var table = settings.Table[Settings]{Command: "install-cni", SetDefaults: true, Settings: []settings.Setting[Settings]{
	{Name: "mounted-cni-net-dir", Envs: []string{"MOUNTED_CNI_NET_DIR"}, Default: DefaultMountedNetDir,
		Usage: "CNI config directory as mounted in this container",
		Set:   settings.Field(func(s *Settings) *string { return &s.MountedNetDir }, absPath)},
	{Name: "cni-net-dir", Envs: []string{"CNI_NET_DIR"}, Default: DefaultHostNetDir,
		Usage: "CNI config directory on the host (replaces __CNI_NET_DIR__)",
		Set:   settings.Field(func(s *Settings) *string { return &s.HostNetDir }, absPath)},
	{Name: "mounted-cni-bin-dir", Envs: []string{"MOUNTED_CNI_BIN_DIR"}, Default: DefaultMountedBinDir,
		Usage: "CNI binary directory as mounted in this container",
		Set:   settings.Field(func(s *Settings) *string { return &s.MountedBinDir }, absPath)},
	{Name: "cni-bin-dir", Envs: []string{"CNI_BIN_DIR"}, Default: DefaultHostBinDir,
		Usage: "CNI binary directory on the host (replaces __CNI_BIN_DIR__)",
		Set:   settings.Field(func(s *Settings) *string { return &s.HostBinDir }, absPath)},
	{Name: "secondary-bin-dir", Envs: []string{"SECONDARY_BIN_DIR"},
		Usage: "a second directory, as mounted here, to install the binaries into (Istio mounts /host/secondary-bin-dir)",
		Set:   settings.Field(func(s *Settings) *string { return &s.SecondaryBinDir }, optionalAbsPath)},
	{Name: "cni-bin-source-dir", Envs: []string{"CNI_BIN_SOURCE_DIR"}, Default: DefaultBinSourceDir,
		Usage: "directory in this image holding the binaries to install",
		Set:   settings.Field(func(s *Settings) *string { return &s.BinSourceDir }, absPath)},
	{Name: "cni-binaries-prefix", Envs: []string{"CNI_BINARIES_PREFIX"},
		Usage: "prefix for the installed binaries' names (Maistra); the entry's type gets it too",
		Set:   setBinariesPrefix},
	{Name: "skip-cni-binaries", Envs: []string{"SKIP_CNI_BINARIES"},
		Usage: "comma-separated binaries not to install",
		Set:   setSkipBinaries},
	{Name: "update-cni-binaries", Envs: []string{"UPDATE_CNI_BINARIES"}, Default: "true", Bool: true,
		Usage: "replace installed binaries that differ from this image's",
		Set:   settings.Field(func(s *Settings) *bool { return &s.UpdateBinaries }, parseBool)},
	{Name: "cni-conf-name", Envs: []string{"CNI_CONF_NAME"},
		Usage: "config file to edit (chained; default: the runtime's choice) or to write (standalone; default zz-istio-cni.conf, which sorts after the node's network config)",
		Set:   setConfName},
	// Set but empty: refused (chainedSwitch).
	{Name: "chained-cni-plugin", Envs: []string{"CHAINED_CNI_PLUGIN"}, Default: "true", Bool: true, EmptyIsValue: true,
		Usage: "insert into the primary CNI's chain; false writes a standalone config",
		Set:   settings.Field(func(s *Settings) *bool { return &s.Chained }, chainedSwitch)},
	{Name: "cni-conf-group-read", Envs: []string{"CNI_CONF_GROUP_READ"}, Default: "false", Bool: true,
		Usage: "the standalone config's mode is 0640 instead of 0600 (a chained entry's file keeps the primary's mode)",
		Set:   settings.Field(func(s *Settings) *bool { return &s.ConfGroupRead }, settings.IstioSwitch)},
	{Name: "cni-network-config", Envs: []string{"CNI_NETWORK_CONFIG"},
		Usage: "template of the plugin's config entry, with __PLACEHOLDERS__ (default: built from the settings)",
		Set:   func(s *Settings, v string) error { s.NetworkConfig = v; return nil }},
	{Name: "cni-network-config-file", Envs: []string{"CNI_NETWORK_CONFIG_FILE"},
		Usage: "file holding the template of the plugin's config entry",
		Set:   settings.Field(func(s *Settings) *string { return &s.NetworkConfigFile }, optionalAbsPath)},
	{Name: "exclude-namespaces", Envs: []string{"EXCLUDED_NAMESPACES", "EXCLUDE_NAMESPACES"},
		Usage: "comma-separated namespaces whose pods the plugin never touches",
		Set:   setExcludeNamespaces},
	{Name: "plugin-log-level", Envs: []string{"LOG_LEVEL", "PLUGIN_LOG_LEVEL"}, Default: string(plugin.DefaultLogLevel),
		Usage: "the plugin's log level: debug, info, warn, error, fatal, panic, none",
		Set:   setPluginLogLevel},
	{Name: "pod-namespace", Envs: []string{"POD_NAMESPACE"},
		Usage: "namespace of this agent's pods (the plugin never redirects them)",
		Set:   setPodNamespace},
	{Name: "native-nftables", Envs: []string{"NATIVE_NFTABLES"}, Default: "false", Bool: true,
		Usage: "the plugin programs nftables instead of iptables",
		Set:   settings.Field(func(s *Settings) *bool { return &s.NativeNftables }, settings.IstioSwitch)},
	{Name: "iptables-mode", Envs: []string{"IPTABLES_MODE"},
		Usage: "the plugin's iptables flavour: legacy, nft, or empty to detect",
		Set:   setIptablesMode},
	{Name: "kubeconfig-mode", Envs: []string{"KUBECONFIG_MODE"}, Default: "0600",
		Usage: "octal file mode of the plugin's kubeconfig",
		Set:   setKubeconfigMode},
	{Name: "service-account-dir", Envs: []string{"SERVICE_ACCOUNT_DIR"}, Default: DefaultServiceAccountDir,
		Usage: "directory holding this agent's ServiceAccount token and ca.crt",
		Set:   settings.Field(func(s *Settings) *string { return &s.ServiceAccountDir }, absPath)},
	{Name: "kube-ca-file", Envs: []string{"KUBE_CA_FILE"},
		Usage: "CA file for the plugin's kubeconfig (default: the service account's ca.crt)",
		Set:   settings.Field(func(s *Settings) *string { return &s.KubeCAFile }, optionalAbsPath)},
	{Name: "skip-tls-verify", Envs: []string{"SKIP_TLS_VERIFY"}, Default: "false", Bool: true,
		Usage: "the plugin's kubeconfig skips verifying the API server's certificate",
		Set:   settings.Field(func(s *Settings) *bool { return &s.SkipTLSVerify }, settings.IstioSwitch)},
	{Name: "kubernetes-service-host", Envs: []string{"KUBERNETES_SERVICE_HOST"},
		Usage: "API server address for the plugin (set by Kubernetes)",
		Set:   setKubeHost},
	{Name: "kubernetes-service-port", Envs: []string{"KUBERNETES_SERVICE_PORT"}, Default: "443",
		Usage: "API server port for the plugin (set by Kubernetes)",
		Set:   settings.Field(func(s *Settings) *uint16 { return &s.KubePort }, port(false))},
	{Name: "kubernetes-service-protocol", Envs: []string{"KUBERNETES_SERVICE_PROTOCOL"}, Default: "https",
		Usage: "API server scheme for the plugin: https or http",
		Set:   setKubeProtocol},
	{Name: "node-name", Envs: []string{"NODE_NAME", "KUBERNETES_NODE_NAME"},
		Usage: "this node's name (replaces __KUBERNETES_NODE_NAME__; default: the host name)",
		Set:   func(s *Settings, v string) error { s.NodeName = strings.TrimSpace(v); return nil }},
	{Name: "cni-agent-run-dir", Envs: []string{"CNI_AGENT_RUN_DIR"}, Default: plugin.DefaultAgentRunDir,
		Usage: "the agent's directory, same path on the host: the plugin's kubeconfig and log socket",
		Set:   settings.Field(func(s *Settings) *string { return &s.RunDir }, absPath)},
	{Name: "monitoring-port", Envs: []string{"MONITORING_PORT"}, Default: strconv.Itoa(DefaultMonitoringPort),
		Usage: "port of /metrics (0: any free port)",
		Set:   settings.Field(func(s *Settings) *uint16 { return &s.MonitoringPort }, port(true))},
	{Name: "readiness-port", Envs: []string{"READINESS_PORT"}, Default: strconv.Itoa(DefaultReadinessPort),
		Usage: "port of /healthz and /readyz (0: any free port)",
		Set:   settings.Field(func(s *Settings) *uint16 { return &s.ReadinessPort }, port(true))},
	{Name: "monitoring-address", Envs: []string{"MONITORING_ADDRESS"},
		Usage: "IP address /metrics listens on (empty: every address)",
		Set:   settings.Field(func(s *Settings) *netip.Addr { return &s.MonitoringAddress }, bindAddress)},
	{Name: "readiness-address", Envs: []string{"READINESS_ADDRESS"},
		Usage: "IP address /healthz and /readyz listen on (empty: every address)",
		Set:   settings.Field(func(s *Settings) *netip.Addr { return &s.ReadinessAddress }, bindAddress)},
	{Name: "revert-warn-count", Envs: []string{"REVERT_WARN_COUNT"}, Default: strconv.Itoa(DefaultRevertWarnCount),
		Usage: "warn when the config loses our entry more often than this within --revert-warn-window",
		Set:   setRevertWarnCount},
	{Name: "revert-warn-window", Envs: []string{"REVERT_WARN_WINDOW"}, Default: DefaultRevertWarnWindow.String(),
		Usage: "window of --revert-warn-count",
		Set:   setRevertWarnWindow},
	{Name: "log_output_level", Envs: []string{"AGENT_LOG_LEVEL"}, Default: "info",
		Usage: "this agent's log level: debug, info, warn, error (Istio's scope:level form is accepted)",
		Set:   setAgentLogLevel},
	{Name: "log_as_json", Envs: []string{"AGENT_LOG_AS_JSON"}, Default: "false", Bool: true,
		Usage: "logs in JSON: this agent's, and the plugin's on its stderr (log_as_json in the generated entry)",
		Set:   settings.Field(func(s *Settings) *bool { return &s.LogJSON }, parseBool)},
	{Name: "pod-name", Envs: []string{"POD_NAME"},
		Usage: "this agent's pod (the downward API's metadata.name): the exit decision and the leases read it",
		Set:   func(s *Settings, v string) error { s.PodName = strings.TrimSpace(v); return nil }},
	{Name: "uninstall-on-exit", Envs: []string{"UNINSTALL_ON_EXIT"}, Default: string(ExitAuto),
		Usage: "on exit, remove the entry, binaries and kubeconfig: auto (only when no agent will run on this node again: the DaemonSet is gone or no longer targets it), always, never",
		Set:   settings.Field(func(s *Settings) *ExitMode { return &s.UninstallOnExit }, parseExitMode)},
	{Name: "plugin-service-account", Envs: []string{"PLUGIN_SERVICE_ACCOUNT"},
		Usage: "ServiceAccount (in POD_NAMESPACE) whose node-bound token the plugin's kubeconfig carries (default: this agent's own token, which dies with its pod)",
		Set:   setPluginServiceAccount},
	{Name: "plugin-token-lifetime", Envs: []string{"PLUGIN_TOKEN_LIFETIME"}, Default: DefaultPluginTokenLifetime.String(),
		Usage: "lifetime of the plugin's token (10m to 8760h); renewed at half of it",
		Set:   settings.Field(func(s *Settings) *time.Duration { return &s.PluginTokenLifetime }, parseTokenLifetime)},
	{Name: "node-dirs-root", Envs: []string{"NODE_DIRS_ROOT"}, Default: DefaultNodeDirsRoot,
		Usage: "where the node's /usr, /sbin and /bin are mounted at their own paths (read-only: the chart's /host/usr, ...): the node check looks for the plugin's iptables tools there when the node's /proc is not mounted",
		Set:   settings.Field(func(s *Settings) *string { return &s.NodeDirsRoot }, absPath)},
	{Name: "pod-cache", Envs: []string{"POD_CACHE_ENABLED"}, Default: "true", Bool: true,
		Usage: "serve this node's pods to the plugin from a watch (needs NODE_NAME and list/watch pods)",
		Set:   settings.Field(func(s *Settings) *bool { return &s.PodCache }, parseBool)},
}}

func setPluginServiceAccount(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if v != "" && !kube.IsDNSSubdomain(v) {
		return fmt.Errorf("%q is not a ServiceAccount name (a DNS subdomain: lower-case letters, digits, - and .)", v)
	}
	s.PluginServiceAccount = v
	return nil
}

func parseTokenLifetime(v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (like 24h)", v)
	}
	if d < MinPluginTokenLifetime || d > MaxPluginTokenLifetime {
		return 0, fmt.Errorf("%s is outside %s to %s", d, MinPluginTokenLifetime, MaxPluginTokenLifetime)
	}
	return d, nil
}

func absPath(v string) (string, error) {
	v = strings.TrimSpace(v)
	if !filepath.IsAbs(v) {
		return "", fmt.Errorf("%q is not an absolute path", v)
	}
	return filepath.Clean(v), nil
}

func optionalAbsPath(v string) (string, error) {
	if strings.TrimSpace(v) == "" {
		return "", nil
	}
	return absPath(v)
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%q is not true or false", v)
	}
	return b, nil
}

func port(zeroOK bool) func(string) (uint16, error) {
	return func(v string) (uint16, error) {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 16)
		if err != nil || (n == 0 && !zeroOK) {
			return 0, fmt.Errorf("%q is not a port number (1-65535)", v)
		}
		return uint16(n), nil
	}
}

// bindAddress is an IP address to listen on; empty is every address.
func bindAddress(v string) (netip.Addr, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address (empty: every address)", v)
	}
	return a, nil
}

// fileNameChars are the characters allowed in a binary prefix and a config file
// name: nothing that could leave the directory or need quoting.
func fileNameChars(v string) bool {
	for _, c := range v {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

func setBinariesPrefix(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if !fileNameChars(v) || strings.HasPrefix(v, ".") {
		return fmt.Errorf("%q is not a file name prefix (letters, digits, - _ . and not starting with .)", v)
	}
	s.BinariesPrefix = v
	return nil
}

func setSkipBinaries(s *Settings, v string) error {
	s.SkipBinaries = nil
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !fileNameChars(name) || name == "." || name == ".." {
			return fmt.Errorf("%q is not a file name", name)
		}
		s.SkipBinaries = append(s.SkipBinaries, name)
	}
	return nil
}

// confExtensions are the file extensions the runtime (libcni) loads.
var confExtensions = []string{".conf", ".conflist", ".json"}

func setConfName(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		s.ConfName = ""
		return nil
	}
	if !fileNameChars(v) || strings.HasPrefix(v, ".") || !slices.Contains(confExtensions, filepath.Ext(v)) {
		return fmt.Errorf("%q is not a CNI config file name (a plain name ending in .conf, .conflist or .json)", v)
	}
	s.ConfName = v
	return nil
}

func setExcludeNamespaces(s *Settings, v string) error {
	s.ExcludeNamespaces = nil
	var bad []string
	for _, ns := range strings.Split(v, ",") {
		ns = strings.TrimSpace(ns)
		switch {
		case ns == "":
		case !kube.IsDNSLabel(ns):
			bad = append(bad, ns)
		case !slices.Contains(s.ExcludeNamespaces, ns):
			s.ExcludeNamespaces = append(s.ExcludeNamespaces, ns)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%q: %q is not a namespace name", v, bad[0])
	}
	return nil
}

func setPluginLogLevel(s *Settings, v string) (err error) {
	s.PluginLogLevel, err = cli.ParseLevel(v)
	return err
}

func setPodNamespace(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if v != "" && !kube.IsDNSLabel(v) {
		return fmt.Errorf("%q is not a namespace name", v)
	}
	s.PodNamespace = v
	return nil
}

func setIptablesMode(s *Settings, v string) error {
	m, err := iptables.ParseMode(v)
	if err != nil {
		return err
	}
	s.IptablesMode = m
	return nil
}

// setKubeconfigMode reads an octal mode written with its leading 0 ("0600",
// "0o600"). Without one the value is refused: Istio's install-cni reads "600" as
// the decimal 600, and "420" as 0644, so a bare number means one mode there and
// another here.
func setKubeconfigMode(s *Settings, v string) error {
	trimmed := strings.TrimSpace(v)
	t := strings.TrimPrefix(strings.TrimPrefix(trimmed, "0o"), "0O")
	n, err := strconv.ParseUint(t, 8, 32)
	if err != nil || t == "" || n > 0o777 {
		return fmt.Errorf("%q is not an octal file mode (0000-0777, e.g. 0600)", v)
	}
	if t == trimmed && !strings.HasPrefix(t, "0") {
		return fmt.Errorf("%q: write the octal mode with its leading 0 (for example 0%s): Istio's install-cni reads a number without one as decimal", v, t)
	}
	if n&0o400 == 0 {
		return fmt.Errorf("%q: the owner could not read the file", v)
	}
	s.KubeconfigMode = os.FileMode(n)
	return nil
}

func setKubeHost(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		s.KubeHost = ""
		return nil
	}
	h := strings.TrimSuffix(strings.TrimPrefix(v, "["), "]")
	if net.ParseIP(h) == nil && !isDNSName(h) {
		return fmt.Errorf("%q is not an IP address or host name", v)
	}
	s.KubeHost = h
	return nil
}

func setKubeProtocol(s *Settings, v string) error {
	v = strings.ToLower(strings.TrimSpace(v))
	if v != "https" && v != "http" {
		return fmt.Errorf("%q is not https or http", v)
	}
	s.KubeProtocol = v
	return nil
}

func setRevertWarnCount(s *Settings, v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return fmt.Errorf("%q is not a positive count", v)
	}
	s.RevertWarnCount = n
	return nil
}

func setRevertWarnWindow(s *Settings, v string) error {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return fmt.Errorf("%q is not a positive duration (like 1m or 30s)", v)
	}
	s.RevertWarnWindow = d
	return nil
}

// PluginLogScope is the scope of Istio's --log_output_level that sets the plugin's
// level ("default:info,cni-plugin:debug"), as Istio's install-cni reads it.
const PluginLogScope = "cni-plugin"

// AgentLogScope is the scope Istio's install-cni logs in: when --log_output_level
// names it (or all), it sets the agent's level, as it sets Istio's agent's.
const AgentLogScope = "cni-agent"

func setAgentLogLevel(s *Settings, v string) error {
	l, err := cli.ParseOutputLevel(v, PluginLogScope)
	if err != nil {
		return err
	}
	if scoped, ok := cli.ScopeLevel(v, AgentLogScope); ok {
		l = scoped
	}
	s.LogLevel = l.Slog()
	return nil
}

// isDNSName reports whether v is a host name: dot-separated labels, case-insensitive.
func isDNSName(v string) bool {
	if v == "" || len(v) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.ToLower(v), ".") {
		if !kube.IsDNSLabel(label) {
			return false
		}
	}
	return true
}

// Usage is the --help text.
func Usage() string {
	return "Usage: install-cni [flags]\n\n" +
		"Installs the istio-cni plugin on this node, keeps its entry in the CNI config,\n" +
		"and removes everything on SIGTERM.\n\n" +
		"Flags (a flag overrides its environment variables; of several variables the last listed wins):\n" +
		table.FlagUsages() +
		"\nThe repair controller reads Istio's REPAIR_* variables (REPAIR_ENABLED, default true), the\n" +
		"node readiness controller the TAINT_* variables (TAINT_ENABLED, default false), and the Multus\n" +
		"support the MULTUS_* variables (MULTUS_ENABLED, default false); see README.md.\n"
}

// ErrHelp is returned by Parse for -h/--help.
var ErrHelp = settings.ErrHelp

// Parse turns command-line arguments and environment variables (looked up with
// lookupEnv) into Settings. A flag overrides its variables; an empty variable counts
// as unset, but for Istio's switches whose default is true, which are false then, as
// Istio reads them (settings.IstioSwitch). Every error names the flag or variable
// and quotes the value.
func Parse(args []string, lookupEnv func(string) (string, bool)) (Settings, error) {
	notices, err := istioSwitches(lookupEnv)
	if err != nil {
		return Settings{}, err
	}
	s := Settings{Notices: notices}
	if err := table.Parse(&s, args, lookupEnv); err != nil {
		return Settings{}, err
	}
	s.given = map[string]string{}
	for _, name := range templatedSettings {
		if v, source, ok := table.Lookup(name, args, lookupEnv); ok {
			s.given[name] = source + " " + redirect.Quote(v)
		}
	}
	// Istio's cni-plugin (or all) scope sets the plugin's level unless the plugin's
	// own setting is given.
	if levels, source, ok := table.Lookup("log_output_level", args, lookupEnv); ok {
		if l, ok := cli.ScopeLevel(levels, PluginLogScope); ok {
			if _, given := s.given["plugin-log-level"]; !given {
				s.PluginLogLevel = l
				s.given["plugin-log-level"] = source + " " + redirect.Quote(levels)
			}
		}
	}
	if err := s.validate(); err != nil {
		return Settings{}, err
	}
	if err := s.parseControllers(lookupEnv); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// parseControllers reads the repair and node readiness controllers' settings. The
// variables they share with the agent (NODE_NAME, POD_NAMESPACE) are answered from
// the agent's own settings, so a flag or KUBERNETES_NODE_NAME reaches them too.
func (s *Settings) parseControllers(lookupEnv func(string) (string, bool)) error {
	lookup := func(name string) (string, bool) {
		switch name {
		case repair.EnvNodeNameAgent:
			return s.NodeName, s.NodeName != ""
		case taint.EnvPodNamespace:
			return s.PodNamespace, s.PodNamespace != ""
		}
		return lookupEnv(name)
	}
	var errs []error
	if s.PodCache && s.NodeName == "" {
		// The host name is not a safe guess: a node's name often differs from it (cloud
		// providers' FQDNs), and a cache of another node's pods would answer nothing.
		errs = append(errs, errors.New("NODE_NAME is not set, and POD_CACHE_ENABLED is true: the pod cache watches only this node's pods "+
			"(set NODE_NAME from the downward API's spec.nodeName, or POD_CACHE_ENABLED=false)"))
	}
	if s.UninstallOnExit == ExitAuto {
		var missing []string
		for _, v := range []struct{ name, value string }{{"POD_NAME", s.PodName}, {"POD_NAMESPACE", s.PodNamespace}, {"NODE_NAME", s.NodeName}} {
			if v.value == "" {
				missing = append(missing, v.name)
			}
		}
		if len(missing) > 0 {
			verb := "are"
			if len(missing) == 1 {
				verb = "is"
			}
			errs = append(errs, fmt.Errorf("UNINSTALL_ON_EXIT=auto tells a restart from a removal by asking the API server about this "+
				"agent's pod, its DaemonSet and its node, but %s %s not set (the chart sets them from the downward API; "+
				"outside Kubernetes set UNINSTALL_ON_EXIT=always or never)", strings.Join(missing, ", "), verb))
		}
	}
	if s.PluginServiceAccount != "" && s.PodNamespace == "" {
		errs = append(errs, fmt.Errorf("PLUGIN_SERVICE_ACCOUNT=%s needs POD_NAMESPACE, the ServiceAccount's namespace", s.PluginServiceAccount))
	}
	var err error
	if s.Repair, err = repair.ConfigFromEnv(lookup); err != nil {
		errs = append(errs, fmt.Errorf("repair controller: %w", err))
	} else if s.Repair.Idle {
		s.Notices = append(s.Notices, fmt.Sprintf("the repair controller is not started: %s is true, but %s, %s and %s are all false, "+
			"so it would do nothing with a broken pod (Istio's install-cni runs it and it does nothing); turn one of them on for repair, "+
			"or set %s=false", repair.EnvEnabled, repair.EnvRepairPods, repair.EnvDeletePods, repair.EnvLabelPods, repair.EnvEnabled))
	}
	if s.Taint, err = taint.ConfigFromEnv(lookup); err != nil {
		errs = append(errs, fmt.Errorf("node readiness controller: %w", err))
	}
	if s.Multus, err = nad.ConfigFromEnv(lookup); err != nil {
		errs = append(errs, fmt.Errorf("multus: %w", err))
	} else if s.Multus.Enabled && s.Chained {
		// Chained, every pod reaches the plugin through the primary network: Multus
		// would look for a network named after the plugin that no file defines, and
		// repair would take pods without the annotation for broken.
		errs = append(errs, fmt.Errorf("%s=true, but CHAINED_CNI_PLUGIN is true: pods join the plugin through Multus only from "+
			"the standalone config (CHAINED_CNI_PLUGIN=false); set one of them false", multus.EnvEnabled))
	}
	return errors.Join(errs...)
}

// NeedsAPIServer reports whether a feature that talks to the API server is on.
func (s *Settings) NeedsAPIServer() bool {
	return s.PodCache || s.Repair.Enabled || s.Taint.Enabled || s.Multus.MeshedNamespaces ||
		s.UninstallOnExit == ExitAuto || s.PluginServiceAccount != ""
}

// validate checks what no single setting can: combinations and requirements.
func (s *Settings) validate() error {
	var errs []error
	if s.KubeHost == "" {
		errs = append(errs, errors.New("the API server address is not set: set KUBERNETES_SERVICE_HOST (Kubernetes sets it in every pod) or --kubernetes-service-host"))
	}
	if s.NetworkConfig != "" && s.NetworkConfigFile != "" {
		errs = append(errs, fmt.Errorf("CNI_NETWORK_CONFIG and CNI_NETWORK_CONFIG_FILE (%q) are both set: give the entry's template once", s.NetworkConfigFile))
	}
	if s.SecondaryBinDir != "" && (s.SecondaryBinDir == s.MountedBinDir) {
		errs = append(errs, fmt.Errorf("SECONDARY_BIN_DIR %q is the CNI bin dir itself", s.SecondaryBinDir))
	}
	for _, d := range []struct{ name, dir string }{{"MOUNTED_CNI_BIN_DIR", s.MountedBinDir}, {"SECONDARY_BIN_DIR", s.SecondaryBinDir}} {
		if d.dir != "" && d.dir == s.BinSourceDir && s.BinariesPrefix == "" {
			errs = append(errs, fmt.Errorf("%s %q is the source dir CNI_BIN_SOURCE_DIR: the binaries would be copied onto themselves", d.name, d.dir))
		}
	}
	if s.MonitoringPort == s.ReadinessPort && s.MonitoringPort != 0 && s.MonitoringAddress != s.ReadinessAddress {
		errs = append(errs, fmt.Errorf("MONITORING_PORT and READINESS_PORT are both %d but MONITORING_ADDRESS %q and READINESS_ADDRESS %q differ: "+
			"one port is one server on one address; give the ports different numbers or the same address",
			s.MonitoringPort, addrOrEvery(s.MonitoringAddress), addrOrEvery(s.ReadinessAddress)))
	}
	if s.MountedNetDir == s.RunDir {
		errs = append(errs, fmt.Errorf("CNI_AGENT_RUN_DIR %q is the CNI config dir: the runtime would see the agent's files", s.RunDir))
	}
	for _, sock := range s.socketPaths() {
		if len(sock) > MaxSocketPathBytes {
			errs = append(errs, fmt.Errorf("CNI_AGENT_RUN_DIR %q is too long: its socket %s would be %d bytes, over the %d of a unix socket's path; choose a shorter directory",
				s.RunDir, sock, len(sock), MaxSocketPathBytes))
			break
		}
	}
	if s.ConfName != "" && !s.Chained && filepath.Ext(s.ConfName) == ".conflist" {
		// A standalone config is a single plugin: written as a .conf.
		errs = append(errs, fmt.Errorf("CNI_CONF_NAME %q: a standalone config is a single plugin and must end in .conf or .json, not .conflist", s.ConfName))
	}
	return errors.Join(errs...)
}

// MaxSocketPathBytes is the longest path a unix socket can be bound to: the
// kernel's sun_path holds 108 bytes, its terminating NUL included. The agent's
// sockets are in CNI_AGENT_RUN_DIR, which is refused when one would not fit.
const MaxSocketPathBytes = 107

// socketPaths are the unix sockets the agent binds in RunDir.
func (s *Settings) socketPaths() []string {
	return []string{s.LogSocketPath(), s.DatagramLogSocketPath(), s.IstioLogSocketPath(), filepath.Join(s.RunDir, plugin.PodCacheSocketName)}
}

// KubeconfigPath is where the plugin's kubeconfig is written (and where the
// plugin looks for it, given cni_agent_run_dir).
func (s *Settings) KubeconfigPath() string { return filepath.Join(s.RunDir, plugin.KubeconfigName) }

// LogSocketPath is the unix SOCK_SEQPACKET socket the plugin sends its log records
// and ADD reports to.
func (s *Settings) LogSocketPath() string { return filepath.Join(s.RunDir, plugin.LogSocketName) }

// DatagramLogSocketPath is the unix datagram socket plugins of earlier builds send
// their log records and ADD reports to.
func (s *Settings) DatagramLogSocketPath() string {
	return filepath.Join(s.RunDir, plugin.DatagramLogSocketName)
}

// IstioLogSocketPath is the unix stream socket Istio's plugin posts its log lines
// to (HTTP).
func (s *Settings) IstioLogSocketPath() string {
	return filepath.Join(s.RunDir, plugin.IstioLogSocketName)
}

// CAFile is the CA written into the plugin's kubeconfig.
func (s *Settings) CAFile() string {
	if s.KubeCAFile != "" {
		return s.KubeCAFile
	}
	return filepath.Join(s.ServiceAccountDir, "ca.crt")
}

// TokenFile is the agent's ServiceAccount token.
func (s *Settings) TokenFile() string { return filepath.Join(s.ServiceAccountDir, "token") }

func addrOrEvery(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// StandaloneNetworkName is the "name" of the standalone config: with Multus, the
// NetworkAttachmentDefinition's (MULTUS_NETWORK_NAME), since Multus finds the config
// of a definition without a spec by that name; otherwise istio-cni.
func (s *Settings) StandaloneNetworkName() string {
	if s.Multus.Enabled && s.Multus.Network != "" {
		return s.Multus.Network
	}
	return PluginType
}

// StandaloneConfMode is the standalone config's file mode: Istio's for the CNI
// configs its install-cni writes, 0600, or 0640 with CNI_CONF_GROUP_READ (the CIS
// benchmark asks for 0600 or less on the node's CNI configs).
func (s *Settings) StandaloneConfMode() os.FileMode {
	if s.ConfGroupRead {
		return 0o640
	}
	return 0o600
}

// PluginName is the installed plugin binary's name and its entry's type.
func (s *Settings) PluginName() string { return s.BinariesPrefix + PluginType }

// EnvAmbientEnabled is Istio's switch for ambient mode.
const EnvAmbientEnabled = "AMBIENT_ENABLED"

// EnvIstioOwnedCNIConfig is Istio's switch for writing the chain to a file of its
// own (ISTIO_OWNED_CNI_CONFIG_FILENAME) instead of into the primary's.
const EnvIstioOwnedCNIConfig = "ISTIO_OWNED_CNI_CONFIG"

// chainedSwitch reads CHAINED_CNI_PLUGIN as an Istio switch (settings.IstioSwitch),
// but for a value set but empty or blank, which it refuses. Istio's install-cni
// reads that as false, a standalone config, which a runtime without Multus never
// runs (it loads the primary's file): every pod would start without the plugin,
// where this agent's default, true, would capture them; neither is a guess to
// make for the node's owner.
func chainedSwitch(v string) (bool, error) {
	if strings.TrimSpace(v) == "" {
		return false, fmt.Errorf("%q: set but empty, which Istio's install-cni reads as false, a standalone config that a runtime "+
			"without Multus never runs (every pod would start without the plugin): set it to true (the default, an entry in the "+
			"primary network's chain) or false", v)
	}
	return settings.IstioSwitch(v)
}

// istioSwitchesNotHere are Istio's switches for what this istio-cni does not
// implement. A refused one stops the agent when true, since ignoring it would leave
// the node other than its owner asked for; one not refused has an effect in Istio's
// install-cni only in ambient mode (AMBIENT_ENABLED, refused), so true is accepted
// with a notice, as Istio's accepts it. False, unset or empty is Istio's sidecar mode.
var istioSwitchesNotHere = []struct {
	env    string
	refuse bool
	why    string
}{
	{EnvAmbientEnabled, true, "this istio-cni has no ambient mode (it captures sidecar pods only); use Istio's own istio-cni for ambient, or unset it"},
	{EnvIstioOwnedCNIConfig, false, "Istio's install-cni writes a copy of the chain in a file of its own (ISTIO_OWNED_CNI_CONFIG_FILENAME) " +
		"only in ambient mode, which this istio-cni does not have; without it Istio's inserts its entry into the primary network's own " +
		"config file, as this agent does, so it has no effect (nor has ISTIO_OWNED_CNI_CONFIG_FILENAME)"},
}

// istioSwitches stops the agent when a refused switch of istioSwitchesNotHere is
// on, or one of them is not a boolean, and returns the notices of those accepted on.
func istioSwitches(lookupEnv func(string) (string, bool)) (notices []string, err error) {
	for _, r := range istioSwitchesNotHere {
		v, ok := lookupEnv(r.env)
		if !ok {
			continue
		}
		on, err := settings.IstioSwitch(v)
		if err != nil {
			return nil, fmt.Errorf("invalid environment variable %s: %w", r.env, err)
		}
		switch {
		case on && r.refuse:
			return nil, fmt.Errorf("environment variable %s=%s: %s", r.env, v, r.why)
		case on:
			notices = append(notices, fmt.Sprintf("environment variable %s=%s has no effect: %s", r.env, v, r.why))
		}
	}
	return notices, nil
}
