package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Entry builds the plugin's config entry: from the template when one is given
// (CNI_NETWORK_CONFIG, or the contents of CNI_NETWORK_CONFIG_FILE passed as
// template), otherwise from the settings. The result is checked with the plugin's
// own config parser, so an entry the plugin would refuse never reaches the node.
func Entry(s *Settings, template string) ([]byte, error) {
	var entry []byte
	if strings.TrimSpace(template) == "" {
		entry = generatedEntry(s)
	} else {
		var err error
		if entry, err = renderTemplate(s, template); err != nil {
			return nil, err
		}
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(entry, &head); err != nil {
		return nil, fmt.Errorf("plugin config entry: %w", err)
	}
	if head.Type != s.PluginName() {
		return nil, fmt.Errorf("plugin config entry: \"type\" is %q, want %q (the installed plugin's name%s)",
			head.Type, s.PluginName(), prefixNote(s))
	}
	cfg, err := plugin.ParseConfig(entry)
	if err != nil {
		return nil, fmt.Errorf("plugin config entry: %w", err)
	}
	if strings.TrimSpace(template) != "" {
		if err := checkTemplateHolds(s, cfg); err != nil {
			return nil, err
		}
	}
	return entry, nil
}

// templatedSettings are the settings (by flag name) that the generated entry
// carries and a template's entry replaces: Istio's install-cni builds its entry
// from them.
var templatedSettings = []string{"exclude-namespaces", "plugin-log-level", "native-nftables", "iptables-mode"}

// checkTemplateHolds refuses a setting of templatedSettings that a flag or
// variable gives and the template's entry does not hold: the entry is used as
// written, so the setting would be ignored (EXCLUDE_NAMESPACES from Istio's
// ConfigMap beside an older chart's CNI_NETWORK_CONFIG: the plugin would not skip
// the namespaces it names). A placeholder (__LOG_LEVEL__) holds its setting.
func checkTemplateHolds(s *Settings, cfg *plugin.Config) error {
	var errs []error
	differs := func(name, entry string) {
		if given, ok := s.given[name]; ok {
			errs = append(errs, fmt.Errorf("%s: %s, but the entry it gives %s: the agent uses a template's entry as written, "+
				"so the setting would be ignored; write it into the template, or unset the setting", templateName(s), given, entry))
		}
	}
	if want, got := namespaceSet(s.ExcludeNamespaces), namespaceSet(cfg.ExcludeNamespaces); !slices.Equal(want, got) {
		differs("exclude-namespaces", fmt.Sprintf("excludes %s (exclude_namespaces)", namespacesText(got)))
	}
	if s.PluginLogLevel != cfg.LogLevel {
		differs("plugin-log-level", fmt.Sprintf("logs at %s (plugin_log_level)", cfg.LogLevel))
	}
	if s.NativeNftables != (cfg.Backend == plugin.BackendNftables) {
		differs("native-nftables", fmt.Sprintf("has native_nftables %t", cfg.Backend == plugin.BackendNftables))
	}
	if s.IptablesMode != cfg.IptablesMode {
		mode := string(cfg.IptablesMode)
		if cfg.IptablesMode == iptables.ModeAuto {
			mode = "auto (detected)"
		}
		differs("iptables-mode", "has iptables_mode "+mode)
	}
	return errors.Join(errs...)
}

func templateName(s *Settings) string {
	if s.NetworkConfigFile != "" {
		return "CNI_NETWORK_CONFIG_FILE " + strconv.Quote(s.NetworkConfigFile)
	}
	return "CNI_NETWORK_CONFIG"
}

// namespaceSet is names sorted, each once.
func namespaceSet(names []string) []string {
	set := slices.Clone(names)
	slices.Sort(set)
	return slices.Compact(set)
}

func namespacesText(names []string) string {
	if len(names) == 0 {
		return "no namespace"
	}
	return redirect.Quote(strings.Join(names, ","))
}

func prefixNote(s *Settings) string {
	if s.BinariesPrefix == "" {
		return ""
	}
	return ", with CNI_BINARIES_PREFIX " + strconv.Quote(s.BinariesPrefix)
}

// generatedEntry is Istio's current entry format. exclude_namespaces is always
// present so that an empty list means "none" rather than a legacy fallback.
// log_as_json follows the agent's own --log_as_json: one switch makes every log of
// the component JSON.
func generatedEntry(s *Settings) []byte {
	e := struct {
		Name              string        `json:"name"`
		Type              string        `json:"type"`
		PluginLogLevel    cli.Level     `json:"plugin_log_level"`
		CNIAgentRunDir    string        `json:"cni_agent_run_dir"`
		ExcludeNamespaces []string      `json:"exclude_namespaces"`
		PodNamespace      string        `json:"pod_namespace,omitempty"`
		NativeNftables    bool          `json:"native_nftables,omitempty"`
		IptablesMode      iptables.Mode `json:"iptables_mode,omitempty"`
		LogAsJSON         bool          `json:"log_as_json,omitempty"`
		ConfigSchema      int           `json:"config_schema"`
	}{
		Name:              PluginType,
		Type:              s.PluginName(),
		PluginLogLevel:    s.PluginLogLevel,
		CNIAgentRunDir:    s.RunDir,
		ExcludeNamespaces: append([]string{}, s.ExcludeNamespaces...),
		PodNamespace:      s.PodNamespace,
		NativeNftables:    s.NativeNftables,
		IptablesMode:      s.IptablesMode,
		LogAsJSON:         s.LogJSON,
		ConfigSchema:      plugin.ConfigSchema,
	}
	out, _ := json.MarshalIndent(e, "", "  ") // strings and bools only: cannot fail
	return out
}

// placeholderRE finds what looks like a placeholder left in a template.
var placeholderRE = regexp.MustCompile(`__[A-Z][A-Z0-9_]*[A-Z0-9]__`)

// refusedPlaceholders are placeholders of older installers the agent will not fill,
// with the reason.
var refusedPlaceholders = map[string]string{
	"__SERVICEACCOUNT_TOKEN__": "a token in the CNI config would be readable by anyone on the node and would never rotate; the plugin reads the kubeconfig at __KUBECONFIG_FILEPATH__",
	"__KUBECONFIG_FILENAME__":  "the kubeconfig is no longer in the CNI config dir; use __KUBECONFIG_FILEPATH__",
}

// placeholders maps each supported placeholder to its value.
func placeholders(s *Settings) map[string]string {
	return map[string]string{
		"__KUBECONFIG_FILEPATH__":     s.KubeconfigPath(),
		"__LOG_LEVEL__":               string(s.PluginLogLevel),
		"__LOG_UDS_ADDRESS__":         s.LogSocketPath(),
		"__CNI_AGENT_RUN_DIR__":       s.RunDir,
		"__KUBERNETES_SERVICE_HOST__": urlHost(s.KubeHost),
		"__KUBERNETES_SERVICE_PORT__": strconv.Itoa(int(s.KubePort)),
		"__KUBERNETES_NODE_NAME__":    s.NodeName,
		"__POD_NAMESPACE__":           s.PodNamespace,
		"__CNI_NET_DIR__":             s.HostNetDir,
		"__CNI_BIN_DIR__":             s.HostBinDir,
		"__CNI_BINARIES_PREFIX__":     s.BinariesPrefix,
	}
}

// urlHost is the API server's host as a URL writes it: an IPv6 address in
// brackets. Templates put __KUBERNETES_SERVICE_HOST__ in a URL (the legacy
// k8s_api_root, "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__"),
// and Kubernetes sets KUBERNETES_SERVICE_HOST to a bare IPv6 address on an IPv6
// cluster, which in a URL is no URL: the plugin would refuse the entry.
func urlHost(host string) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]"
	}
	return host
}

// renderTemplate fills the template's placeholders. Templates put placeholders
// inside JSON strings, so each value is JSON-escaped (without its quotes).
func renderTemplate(s *Settings, template string) ([]byte, error) {
	for p, why := range refusedPlaceholders {
		if strings.Contains(template, p) {
			return nil, fmt.Errorf("CNI_NETWORK_CONFIG: placeholder %s is not supported: %s", p, why)
		}
	}
	vals := placeholders(s)
	// A template that brackets the host itself gets one pair of brackets, and only
	// for IPv6.
	pairs := []string{"[__KUBERNETES_SERVICE_HOST__]", vals["__KUBERNETES_SERVICE_HOST__"]}
	for _, p := range slices.Sorted(maps.Keys(vals)) {
		q, _ := json.Marshal(vals[p])
		pairs = append(pairs, p, string(q[1:len(q)-1]))
	}
	out := strings.NewReplacer(pairs...).Replace(template)
	if left := placeholderRE.FindAllString(out, -1); len(left) > 0 {
		return nil, fmt.Errorf("CNI_NETWORK_CONFIG: unknown placeholder %s (supported: %s)", left[0], strings.Join(slices.Sorted(maps.Keys(vals)), ", "))
	}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, fmt.Errorf("CNI_NETWORK_CONFIG: not a JSON object after filling placeholders: %v", errOr(err, "null"))
	}
	if dec.More() {
		return nil, fmt.Errorf("CNI_NETWORK_CONFIG: more than one JSON value")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(out)); err != nil {
		return nil, fmt.Errorf("CNI_NETWORK_CONFIG: %w", err)
	}
	var pretty bytes.Buffer
	_ = json.Indent(&pretty, buf.Bytes(), "", "  ") // compacted valid JSON
	return pretty.Bytes(), nil
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}
