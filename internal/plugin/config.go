package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/jsontree"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Config is the plugin's configuration from the CNI network config on stdin, merged
// from the current and the legacy formats, defaulted and validated. ParseConfig is
// the only way to get one.
//
// Precedence when both formats set the same thing: the current key wins.
//
//	log level           plugin_log_level > log_level > "info" (an empty or blank
//	                    level is as if absent, as Istio's plugin reads it)
//	excluded namespaces exclude_namespaces > kubernetes.exclude_namespaces > none
//	kubeconfig          <cni_agent_run_dir>/istio-cni-kubeconfig when cni_agent_run_dir
//	                    is set > kubernetes.kubeconfig > /var/run/istio-cni/istio-cni-kubeconfig
//	log socket          log_socket > log_uds_address > <run dir>/pseq.sock
//
// A key that is present always counts, even when empty, but for a log level:
// "exclude_namespaces": [] excludes nothing although kubernetes.exclude_namespaces
// lists some, and "log_socket": "" turns the socket off.
type Config struct {
	// The standard CNI fields: cniVersion, name, type, prevResult and the rest.
	types.NetConf
	// RuntimeConfig is passed by the runtime for declared capabilities; kept as is.
	RuntimeConfig json.RawMessage

	// LogLevel is the plugin's log level, one of Istio's names.
	LogLevel cli.Level
	// AgentRunDir is the node agent's run directory on the host (cni_agent_run_dir).
	AgentRunDir string
	// Kubeconfig is the path of the kubeconfig the plugin uses for pod lookups.
	Kubeconfig string
	// K8sAPIRoot overrides the kubeconfig's server URL (legacy kubernetes.k8s_api_root).
	K8sAPIRoot string
	// ExcludeNamespaces are namespaces whose pods are never touched.
	ExcludeNamespaces []string
	// PodNamespace is the namespace of the node agent (istio-cni-node) pods.
	PodNamespace string
	// NodeName is the legacy kubernetes.node_name; informational.
	NodeName string
	// CNIBinDir is the legacy kubernetes.cni_bin_dir; informational, the plugin runs
	// no helper binaries.
	CNIBinDir string
	// Backend programs the rules: iptables (default) or native nftables.
	Backend Backend
	// IptablesMode picks the iptables flavour for the iptables backend; empty means
	// detect as istio-iptables does.
	IptablesMode iptables.Mode
	// AmbientEnabled is Istio's ambient_enabled. This plugin has no ambient mode, so
	// true is refused (Validate) rather than ignored: traffic that ambient would
	// capture must not silently bypass every proxy.
	AmbientEnabled bool
	PodLookup      PodLookup
	// ExtraBypassUIDs are node-wide, admin-owned uids whose traffic (DNS included)
	// bypasses redirection like the proxy's, for init containers running as a fixed
	// uid when the proxy's uid differs (OpenShift picks it per namespace).
	ExtraBypassUIDs []uint32
	// LogSocket is a unix socket the node agent reads logs from, used when it exists;
	// empty means none.
	LogSocket string
	// LogFile is a file logs are appended to as well; empty means none.
	LogFile string
	// LogJSON writes the plugin's stderr (the runtime's journal) as JSON lines, as
	// Istio's plugin does; the file and the socket are JSON either way.
	LogJSON bool

	// keys maps a Config field to the config key its value came from, so that
	// validation errors name what the user wrote.
	keys map[string]string
	// prevResult is the previous result as the runtime wrote it, which
	// ParsePrevResult decodes into PrevResult; prevResultErr is its error, kept
	// for every caller.
	prevResult    json.RawMessage
	prevResultErr error
	// given is prevResult parsed, when givenOK (see givenResult).
	given              jsontree.Value
	givenRead, givenOK bool
}

// Backend is the rule backend.
type Backend string

const (
	BackendIptables Backend = "iptables"
	BackendNftables Backend = "nftables"
)

// PodLookup bounds the pod lookup. Istio tries 30 times, 1 s apart: a pod may not be
// visible to the API server's cache yet when the runtime calls us.
type PodLookup struct {
	Retries  int
	Interval time.Duration
}

// Bound is the most the whole lookup may take, requests and waits included:
// Retries x Interval (30 s by default), and never less than one request's timeout
// (PodRequestTimeout): a short interval must not cut off an API server that is
// slow under a burst of ADDs but answers. Each request gets at most
// PodRequestTimeout of it. A product past the largest Duration is that largest
// Duration, never a wrapped one (Validate refuses any over MaxPodLookupBound).
func (l PodLookup) Bound() time.Duration {
	if l.overLimit(math.MaxInt64) {
		return math.MaxInt64
	}
	return max(time.Duration(l.Retries)*l.Interval, PodRequestTimeout)
}

// overLimit says whether Retries x Interval is more than limit, without
// computing the product (which may not fit a Duration); false when either is not
// positive.
func (l PodLookup) overLimit(limit time.Duration) bool {
	return l.Retries > 0 && l.Interval > 0 && int64(l.Retries) > int64(limit/l.Interval)
}

// MaxPodLookupBound bounds the lookup's bound, well under the runtime's own CNI
// timeout (the kubelet gives a sandbox 4 minutes, and the plugin's command 2).
const MaxPodLookupBound = time.Minute

// Defaults, Istio's where Istio has one.
const (
	DefaultAgentRunDir = "/var/run/istio-cni"
	KubeconfigName     = "istio-cni-kubeconfig"
	// TLSSessionName is the file in the run directory where the plugin keeps its
	// TLS session to the API server, so the next run resumes it (kube.SessionFile).
	TLSSessionName = "istio-cni-tls-session"
	// XtablesDirName is the directory in the run directory where the plugin keeps
	// the per-namespace xtables locks of legacy iptables and the node's
	// iptables-nft version (and where GC removes the apply lock files of builds
	// before the apply lock became the namespace's own, applylock).
	XtablesDirName = "xtables"
	// LogSocketName is the agent's SOCK_SEQPACKET socket for this plugin's log
	// records and events (pluginlog.Options.Socket); Istio's plugin posts to
	// IstioLogSocketName instead. Short: a unix socket's path is at most 107 bytes.
	LogSocketName = "pseq.sock"
	// DatagramLogSocketName is the agent's datagram socket, the log socket of
	// builds before LogSocketName: the agent still listens there for their plugins
	// during an upgrade, and this plugin sends there when it finds only that (a
	// node rolled back to such an agent).
	DatagramLogSocketName = "plog.sock"
	// IstioLogSocketName is the socket Istio's plugin posts its log lines to, over
	// HTTP (POST /log, a JSON array of JSON-encoded records); the agent serves it so
	// that an Istio plugin still running during a switch loses no log line.
	IstioLogSocketName      = "log.sock"
	LogFileName             = "istio-cni.log"
	DefaultLogLevel         = cli.LevelInfo
	DefaultPodLookupRetries = 30
	DefaultPodLookupDelay   = time.Second
	// MaxExtraBypassUIDs bounds extra_bypass_uids: each uid is a rule per hook.
	MaxExtraBypassUIDs = 64
)

// ParseConfig decodes, defaults and validates the plugin's config.
func ParseConfig(data []byte) (*Config, error) {
	raw, err := decodeConfig(data)
	if err != nil {
		return nil, err
	}
	cfg := raw.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// CleanupConfig is the config DEL removes the pod's capture with, and GC the
// run directory's stale files, when ParseConfig refuses the config: one that
// decodes, but with a value that no longer validates (edited since the pod's
// ADD, or refused by a stricter build since), still names where the ADD put the
// rules and its locks. It keeps only what the
// cleanup uses (NewBackend's backend, iptables flavour and run directory), each
// valid as Validate has it, over the defaults; an error when the config does not
// decode or one of those is itself invalid.
func CleanupConfig(data []byte) (*Config, error) {
	raw, err := decodeConfig(data)
	if err != nil {
		return nil, err
	}
	given := raw.withDefaults()
	cfg := rawConfig{}.withDefaults()
	cfg.NetConf = given.NetConf
	cfg.AgentRunDir, cfg.Backend, cfg.IptablesMode = given.AgentRunDir, given.Backend, given.IptablesMode
	cfg.keys = given.keys
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// rawConfig is the config as written. Pointers tell "absent" from "empty"; keys the
// plugin accepts only for compatibility are decoded to check their type.
type rawConfig struct {
	types.NetConf
	RuntimeConfig json.RawMessage `json:"runtimeConfig,omitempty"`
	// PrevResult is kept as the runtime wrote it (it shadows NetConf's
	// RawPrevResult, a generic map): ParsePrevResult decodes it once, where the
	// CNI library would decode it into a map, encode the map and decode that.
	PrevResult json.RawMessage `json:"prevResult,omitempty"`

	// Istio's current format.
	PluginLogLevel      *string         `json:"plugin_log_level"`
	CNIAgentRunDir      *string         `json:"cni_agent_run_dir"`
	ExcludeNamespaces   *[]string       `json:"exclude_namespaces"`
	PodNamespace        *string         `json:"pod_namespace"`
	NativeNftables      *bool           `json:"native_nftables"`
	AmbientEnabled      *bool           `json:"ambient_enabled"`
	EnablementSelectors json.RawMessage `json:"enablement_selectors"`

	// The legacy format (Istio up to 1.2x, Maistra, the seed documents).
	LogLevel        *string        `json:"log_level"`
	LogUDSAddress   *string        `json:"log_uds_address"`
	HostNSEnterExec *bool          `json:"hostNSEnterExec"`
	Kubernetes      *rawKubernetes `json:"kubernetes"`

	// Ours.
	ConfigSchema    *int           `json:"config_schema"`
	IptablesMode    *string        `json:"iptables_mode"`
	PodLookup       *rawPodLookup  `json:"pod_lookup"`
	ExtraBypassUIDs []uint32       `json:"extra_bypass_uids"`
	LogSocket       *string        `json:"log_socket"`
	LogFile         *string        `json:"log_file"`
	LogAsJSON       *bool          `json:"log_as_json"`
	podLookupDelay  *time.Duration // parsed pod_lookup.interval
}

type rawKubernetes struct {
	Kubeconfig           *string   `json:"kubeconfig"`
	K8sAPIRoot           *string   `json:"k8s_api_root"`
	ExcludeNamespaces    *[]string `json:"exclude_namespaces"`
	CNIBinDir            *string   `json:"cni_bin_dir"`
	InterceptType        *string   `json:"intercept_type"`
	NodeName             *string   `json:"node_name"`
	NetnsSetupExecutable *string   `json:"netns_setup_executable"`
	IptablesScript       *string   `json:"iptables_script"`
}

type rawPodLookup struct {
	Retries  *int    `json:"retries"`
	Interval *string `json:"interval"`
}

// decodeConfig checks the JSON and the type of every known key. Unknown keys are
// ignored: runtimes and installers add their own.
func decodeConfig(data []byte) (rawConfig, error) {
	var raw rawConfig
	if err := decodeJSON(data, &raw); err != nil {
		// A newer schema may have changed a key's type: say so rather than name
		// the key. (The decode goes on after a type error, so config_schema is
		// there when it is itself well typed.)
		if err := checkSchema(raw.ConfigSchema); err != nil {
			return rawConfig{}, err
		}
		return rawConfig{}, withCode(types.ErrDecodingFailure, configJSONError(err))
	}
	if err := checkSchema(raw.ConfigSchema); err != nil {
		return rawConfig{}, err
	}
	if k := raw.Kubernetes; k != nil && k.InterceptType != nil {
		if t := *k.InterceptType; t != "" && t != "iptables" {
			return rawConfig{}, withCode(types.ErrUnsupportedField, fmt.Errorf(`plugin config: "kubernetes.intercept_type": %q is not an intercept type (iptables)`, t))
		}
	}
	if p := raw.PodLookup; p != nil && p.Interval != nil {
		d, err := time.ParseDuration(strings.TrimSpace(*p.Interval))
		if err != nil {
			return rawConfig{}, fmt.Errorf(`plugin config: "pod_lookup.interval": %q is not a duration (like "1s" or "500ms")`, *p.Interval)
		}
		raw.podLookupDelay = &d
	}
	return raw, nil
}

// codedError is an error that the runtime gets with a CNI error code of its own
// (cniError), where the code its caller would give is not the right one.
type codedError struct {
	code uint
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func withCode(code uint, err error) error { return &codedError{code: code, err: err} }

// ConfigErrorCode is the CNI error code of an error of ParseConfig: the spec's 6
// (failed to decode) for JSON that is not a config or a key of the wrong type, 2
// (unsupported field) for a setting this plugin does not support, 11 (try again
// later) for a config of a newer schema, whose binary the agent is installing,
// and 7 (invalid network config) for any other value. With several problems,
// the first that has a code of its own decides.
func ConfigErrorCode(err error) uint {
	var coded *codedError
	switch {
	case errors.As(err, &coded):
		return coded.code
	case errors.Is(err, ErrNewerConfig):
		return types.ErrTryAgainLater
	}
	return types.ErrInvalidNetworkConfig
}

// ConfigSchema is the version of the plugin config this binary understands. The
// agent writes it into the entry it generates ("config_schema"); it goes up when a key
// is added that a plugin must not ignore (one that changes what is captured). During
// an upgrade the agent replaces the binary before the config, so a newer config meets
// an older binary only on a rollback or a partial copy: that binary then refuses the
// config (fail closed: the runtime retries the pod) instead of ignoring what it does
// not know. An older config (or one without the key: Istio's, the seed's) is read by
// a newer binary as before.
const ConfigSchema = 1

// ErrNewerConfig is returned for a config of a schema newer than ConfigSchema.
var ErrNewerConfig = errors.New("the config is newer than this istio-cni binary")

func checkSchema(v *int) error {
	switch {
	case v == nil:
		return nil
	case *v < 1:
		return fmt.Errorf(`plugin config: "config_schema": %d is not a schema version (1 or more)`, *v)
	case *v > ConfigSchema:
		return fmt.Errorf(`plugin config: "config_schema" is %d, this istio-cni binary understands up to %d: %w `+
			`(the node agent that wrote it installs a matching binary before its config; a rollback or a copied config `+
			`may leave this state): refusing rather than ignoring settings it does not know`, *v, ConfigSchema, ErrNewerConfig)
	}
	return nil
}

// configJSONError turns encoding/json's errors into ones that name the key.
func configJSONError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return fmt.Errorf("plugin config: must be a JSON object, got %s", typeErr.Value)
		}
		return fmt.Errorf("plugin config: %q: got %s, want %s", typeErr.Field, typeErr.Value, describeType(typeErr.Type))
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("plugin config: invalid JSON at byte %d: %w", syntaxErr.Offset, err)
	}
	return fmt.Errorf("plugin config: %w", err)
}

func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint32:
		return "an integer 0-4294967295"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Slice, reflect.Array:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(describeType(t.Elem()), "a "), "an ") + "s"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// withDefaults merges the formats (current wins) and fills in defaults. It never
// fails: values are checked by Validate.
func (r rawConfig) withDefaults() Config {
	c := Config{
		NetConf:       r.NetConf,
		RuntimeConfig: r.RuntimeConfig,
		prevResult:    r.PrevResult,
		LogLevel:      DefaultLogLevel,
		AgentRunDir:   DefaultAgentRunDir,
		Backend:       BackendIptables,
		PodLookup:     PodLookup{Retries: DefaultPodLookupRetries, Interval: DefaultPodLookupDelay},
		keys:          map[string]string{},
	}
	k := r.Kubernetes
	if k == nil {
		k = &rawKubernetes{}
	}
	// An empty or blank level names none: Istio's plugin sets its level only from
	// a plugin_log_level that is not empty, and its legacy plugin read an empty
	// log_level as info. So the other key, then the default, speaks.
	switch {
	case levelGiven(r.PluginLogLevel):
		c.LogLevel, c.keys["LogLevel"] = logLevel(*r.PluginLogLevel), "plugin_log_level"
	case levelGiven(r.LogLevel):
		c.LogLevel, c.keys["LogLevel"] = logLevel(*r.LogLevel), "log_level"
	}
	if r.CNIAgentRunDir != nil {
		c.AgentRunDir, c.keys["AgentRunDir"] = *r.CNIAgentRunDir, "cni_agent_run_dir"
	}
	switch {
	case r.CNIAgentRunDir != nil:
		c.Kubeconfig, c.keys["Kubeconfig"] = path.Join(c.AgentRunDir, KubeconfigName), "cni_agent_run_dir"
	case k.Kubeconfig != nil:
		c.Kubeconfig, c.keys["Kubeconfig"] = *k.Kubeconfig, "kubernetes.kubeconfig"
	default:
		c.Kubeconfig = path.Join(c.AgentRunDir, KubeconfigName)
	}
	switch {
	case r.ExcludeNamespaces != nil:
		c.ExcludeNamespaces, c.keys["ExcludeNamespaces"] = slices.Clone(*r.ExcludeNamespaces), "exclude_namespaces"
	case k.ExcludeNamespaces != nil:
		c.ExcludeNamespaces, c.keys["ExcludeNamespaces"] = slices.Clone(*k.ExcludeNamespaces), "kubernetes.exclude_namespaces"
	}
	if r.PodNamespace != nil {
		c.PodNamespace = *r.PodNamespace
	}
	if k.K8sAPIRoot != nil {
		c.K8sAPIRoot = *k.K8sAPIRoot
	}
	if k.NodeName != nil {
		c.NodeName = *k.NodeName
	}
	if k.CNIBinDir != nil {
		c.CNIBinDir = *k.CNIBinDir
	}
	if r.NativeNftables != nil && *r.NativeNftables {
		c.Backend = BackendNftables
	}
	if r.IptablesMode != nil {
		// iptables.ParseMode's spellings ("auto" is detection); a bad value is kept
		// for Validate to name.
		c.IptablesMode = iptables.Mode(*r.IptablesMode)
		if m, err := iptables.ParseMode(*r.IptablesMode); err == nil {
			c.IptablesMode = m
		}
	}
	if r.AmbientEnabled != nil {
		c.AmbientEnabled = *r.AmbientEnabled
	}
	if p := r.PodLookup; p != nil && p.Retries != nil {
		c.PodLookup.Retries = *p.Retries
	}
	if r.podLookupDelay != nil {
		c.PodLookup.Interval = *r.podLookupDelay
	}
	c.ExtraBypassUIDs = dedupUIDs(r.ExtraBypassUIDs)
	switch {
	case r.LogSocket != nil:
		c.LogSocket, c.keys["LogSocket"] = *r.LogSocket, "log_socket"
	case r.LogUDSAddress != nil:
		c.LogSocket, c.keys["LogSocket"] = *r.LogUDSAddress, "log_uds_address"
	default:
		c.LogSocket = path.Join(c.AgentRunDir, LogSocketName)
	}
	if r.LogFile != nil {
		c.LogFile, c.keys["LogFile"] = *r.LogFile, "log_file"
	} else {
		c.LogFile = path.Join(c.AgentRunDir, LogFileName)
	}
	if r.LogAsJSON != nil {
		c.LogJSON, c.keys["LogJSON"] = *r.LogAsJSON, "log_as_json"
	}
	return c
}

// levelGiven says whether a log level key names a level: present, and not empty
// or blank.
func levelGiven(v *string) bool { return v != nil && strings.TrimSpace(*v) != "" }

// logLevel is the level named by v, or v itself (trimmed, lower-case) for Validate
// to report when it names none.
func logLevel(v string) cli.Level {
	if l, err := cli.ParseLevel(v); err == nil {
		return l
	}
	return cli.Level(strings.ToLower(strings.TrimSpace(v)))
}

func dedupUIDs(ids []uint32) []uint32 {
	var out []uint32
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// key names the config key a field's value came from, or its default key.
func (c *Config) key(field, fallback string) string {
	if k := c.keys[field]; k != "" {
		return k
	}
	return fallback
}

// Validate checks every value, naming the key and quoting the value at fault.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("plugin config: %q: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, err := cli.ParseLevel(string(c.LogLevel)); err != nil {
		bad(c.key("LogLevel", "plugin_log_level"), "%q is not a log level (panic, fatal, error, warn, info, debug, none)", c.LogLevel)
	}
	absPath := func(key, p string, optional bool) {
		if p == "" && optional {
			return
		}
		if !path.IsAbs(p) {
			bad(key, "%q is not an absolute path", p)
		}
	}
	if c.AmbientEnabled {
		errs = append(errs, withCode(types.ErrUnsupportedField, fmt.Errorf("plugin config: %q: %s", "ambient_enabled",
			"true is not supported: this istio-cni captures sidecar pods only and has no ambient mode (remove the setting or set it to false)")))
	}
	absPath(c.key("AgentRunDir", "cni_agent_run_dir"), c.AgentRunDir, false)
	// Paths derived from a bad run dir would only repeat its error.
	runDirOK := path.IsAbs(c.AgentRunDir)
	given := func(field string) bool { k := c.keys[field]; return k != "" && k != "cni_agent_run_dir" }
	if runDirOK || given("Kubeconfig") {
		absPath(c.key("Kubeconfig", "kubernetes.kubeconfig"), c.Kubeconfig, false)
	}
	if runDirOK || given("LogSocket") {
		absPath(c.key("LogSocket", "log_socket"), c.LogSocket, true)
	}
	if runDirOK || given("LogFile") {
		absPath("log_file", c.LogFile, true)
	}
	absPath("kubernetes.cni_bin_dir", c.CNIBinDir, true)
	if c.K8sAPIRoot != "" {
		u, err := url.Parse(c.K8sAPIRoot)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("kubernetes.k8s_api_root", "%s is not an http(s) URL", kube.RedactURL(c.K8sAPIRoot))
		}
	}
	for _, ns := range c.ExcludeNamespaces {
		if !kube.IsDNSLabel(ns) {
			bad(c.key("ExcludeNamespaces", "exclude_namespaces"), "%q is not a namespace name", ns)
		}
	}
	if c.PodNamespace != "" && !kube.IsDNSLabel(c.PodNamespace) {
		bad("pod_namespace", "%q is not a namespace name", c.PodNamespace)
	}
	if c.Backend != BackendIptables && c.Backend != BackendNftables {
		bad("native_nftables", "unknown backend %q", c.Backend)
	}
	if _, err := iptables.ParseMode(string(c.IptablesMode)); err != nil {
		bad("iptables_mode", "%v", err)
	}
	if c.PodLookup.Retries < 1 {
		bad("pod_lookup.retries", "%d: at least one try is needed", c.PodLookup.Retries)
	}
	if c.PodLookup.Interval <= 0 {
		bad("pod_lookup.interval", "%s: must be positive", c.PodLookup.Interval)
	} else if c.PodLookup.overLimit(MaxPodLookupBound) { // before multiplying: the product may not fit a Duration
		bad("pod_lookup", "retries %d x interval %s is more than the limit of %s", c.PodLookup.Retries, c.PodLookup.Interval, MaxPodLookupBound)
	}
	if len(c.ExtraBypassUIDs) > MaxExtraBypassUIDs {
		bad("extra_bypass_uids", "%d uids given, at most %d are supported", len(c.ExtraBypassUIDs), MaxExtraBypassUIDs)
	}
	if slices.Contains(c.ExtraBypassUIDs, 0) {
		bad("extra_bypass_uids", "uid 0 (root) may not bypass redirection")
	}
	// Refused here, not at each ADD: the rules could never be built, so every meshed
	// pod's ADD would fail while the node looked ready.
	if slices.Contains(c.ExtraBypassUIDs, redirect.InvalidID) {
		bad("extra_bypass_uids", "uid %d is (uid_t)-1, which no process has and iptables refuses", uint32(redirect.InvalidID))
	}
	return errors.Join(errs...)
}

// PrevResultIPs returns the addresses in the previous plugin's result, in order; nil
// when the plugin runs standalone (no prevResult). A result of the config's version
// (what the runtime gives) is read as given, where every version this plugin
// speaks (0.3.0 to 1.1.0) writes them alike: "ips", a list of objects whose
// "address" is a CIDR; an entry without an address is skipped, as the CNI
// library's result does. That read is without the library's decode (and its
// reflection): for a pod to redirect the addresses are all of the previous result
// ADD needs, and ADD prints a result of the config's version as given
// (printResult). TestPrevResultIPsAgreesWithTheCNILibrary holds it to the
// library's reading. Any other result (of another version, or in a Config built
// in code) is read through the library.
func (c *Config) PrevResultIPs() ([]netip.Addr, error) {
	doc, ok := c.givenResult()
	if !ok {
		// Built in code, absent, or of another version (which the library
		// converts, or refuses when the config's version cannot hold it).
		return c.prevResultIPsFromLibrary()
	}
	var ips jsontree.Value
	for _, m := range doc.Members() {
		if jsontree.Is(m.Key, "ips") {
			ips = m.Value
		}
	}
	if ips.Kind == jsontree.Null {
		return nil, nil
	}
	if ips.Kind != jsontree.Array {
		return nil, fmt.Errorf(`plugin config: prevResult: "ips": got %s, want a list`, ips.Kind)
	}
	var out []netip.Addr
	for i, ip := range ips.Elems() {
		if ip.Kind == jsontree.Null {
			continue
		}
		if ip.Kind != jsontree.Object {
			return nil, fmt.Errorf(`plugin config: prevResult: "ips"[%d]: got %s, want an object`, i, ip.Kind)
		}
		var address *jsontree.Value
		for _, m := range ip.Members() {
			if jsontree.Is(m.Key, "address") {
				address = &m.Value
			}
		}
		if address == nil {
			continue
		}
		if address.Kind != jsontree.String {
			// null included: the library reads it as the empty string.
			return nil, fmt.Errorf(`plugin config: prevResult: "ips"[%d].address: got %s, want a CIDR`, i, address.Kind)
		}
		prefix, err := netip.ParsePrefix(address.Str())
		if err != nil {
			return nil, fmt.Errorf(`plugin config: prevResult: "ips"[%d].address: %q is not a CIDR`, i, address.Str())
		}
		out = append(out, prefix.Addr().Unmap())
	}
	return out, nil
}

// HasPrevResult says whether the config carries a previous result (a prevResult
// that is not absent or null).
func (c *Config) HasPrevResult() bool {
	if len(c.prevResult) > 0 {
		return string(c.prevResult) != "null"
	}
	return c.RawPrevResult != nil
}

// givenResult is the previous result as the runtime gave it, parsed once, when it
// is of the config's version (what a runtime gives): ADD prints it as given
// (printResult) and reads its addresses from it (PrevResultIPs). ok is false
// otherwise (absent, of another version, or in a Config built in code), and the
// CNI library reads it.
func (c *Config) givenResult() (doc jsontree.Value, ok bool) {
	if !c.givenRead {
		c.givenRead = true
		if len(c.prevResult) > 0 && c.CNIVersion != "" {
			if d, err := jsontree.Parse(c.prevResult); err == nil {
				if v, isString := d.StringMember("cniVersion"); isString && v == c.CNIVersion {
					c.given, c.givenOK = d, true
				}
			}
		}
	}
	return c.given, c.givenOK
}

// prevResultIPsFromLibrary reads the addresses from the result the CNI library
// parsed (ParsePrevResult).
func (c *Config) prevResultIPsFromLibrary() ([]netip.Addr, error) {
	if err := c.ParsePrevResult(); err != nil {
		return nil, err
	}
	if c.PrevResult == nil {
		return nil, nil
	}
	cur, ok := c.PrevResult.(*types100.Result)
	if !ok {
		var err error
		if cur, err = types100.NewResultFromResult(c.PrevResult); err != nil {
			return nil, fmt.Errorf("plugin config: prevResult: %w", err)
		}
	}
	var out []netip.Addr
	for _, ip := range cur.IPs {
		if ip == nil { // "ips": [null]
			continue
		}
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}

// ParsePrevResult parses the previous result into PrevResult, once, as the
// config's cniVersion says (as the CNI library does): ADD's printed result and the
// addresses that decide its capture come from that one parse. (Reading the raw
// form after a parse once found nothing: the library's parse empties it, and ADD
// then read the namespace's addresses instead.) A parse error is kept and
// returned to every caller.
func (c *Config) ParsePrevResult() error {
	if c.prevResultErr != nil || c.PrevResult != nil {
		return c.prevResultErr
	}
	switch {
	case len(c.prevResult) > 0 && namesNoVersion(c.prevResult):
		// "Prior to 1.0.0, Result types may not marshal a CNIVersion", and runtimes
		// before libcni 1.0 passed such a result on as it was: the library's parse
		// reads it as of the config's version.
		conf := types.NetConf{CNIVersion: c.CNIVersion}
		err := json.Unmarshal(c.prevResult, &conf.RawPrevResult)
		if err == nil {
			err = version.ParsePrevResult(&conf)
		}
		if err != nil {
			c.prevResultErr = fmt.Errorf("plugin config: prevResult: %w", err)
		} else {
			c.PrevResult = conf.PrevResult
		}
	case len(c.prevResult) > 0 && string(c.prevResult) != "null":
		res, err := create.Create(c.CNIVersion, c.prevResult)
		if err != nil {
			c.prevResultErr = fmt.Errorf("plugin config: prevResult: could not parse prevResult: %w", err)
		} else {
			c.PrevResult = res
		}
	case c.RawPrevResult != nil: // a Config built in code rather than parsed
		if err := version.ParsePrevResult(&c.NetConf); err != nil {
			c.prevResultErr = fmt.Errorf("plugin config: prevResult: %w", err)
		}
	}
	return c.prevResultErr
}

// namesNoVersion says whether a previous result is an object whose cniVersion is
// absent, null or empty.
func namesNoVersion(prevResult []byte) bool {
	doc, err := jsontree.Parse(prevResult)
	if err != nil || doc.Kind != jsontree.Object {
		return false
	}
	v, ok := doc.StringMember("cniVersion")
	return ok && v == ""
}
