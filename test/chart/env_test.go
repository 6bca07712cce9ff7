package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

// The env value adds variables to the agent container after the chart's own, so
// they win over Kubernetes' service variables (a node without kube-proxy points
// KUBERNETES_SERVICE_HOST/PORT at the API server); a bad name or an object is refused.
func TestEnvValueAddsTheAgentsVariablesLast(t *testing.T) {
	m := mustRender(t, "--set", "env.KUBERNETES_SERVICE_HOST=127.0.0.1", "--set-string", "env.KUBERNETES_SERVICE_PORT=6443")
	env := m.agent(t).Env
	if len(env) < 2 {
		t.Fatalf("agent env %v", env)
	}
	last := env[len(env)-2:]
	if last[0].Name != "KUBERNETES_SERVICE_HOST" || last[0].Value != "127.0.0.1" ||
		last[1].Name != "KUBERNETES_SERVICE_PORT" || last[1].Value != "6443" {
		t.Errorf("last env entries %+v, want KUBERNETES_SERVICE_HOST=127.0.0.1 then KUBERNETES_SERVICE_PORT=6443", last)
	}
	if _, err := render(t, "--set", "env.1BAD=x"); err == nil || !strings.Contains(err.Error(), "1BAD") {
		t.Errorf("env.1BAD: got %v, want the schema to refuse the name", err)
	}
	// Istio's chart takes any scalar and writes it as text.
	if got := mustRender(t, "--set", "env.PORT=8080").env(t)["PORT"]; got != "8080" {
		t.Errorf("env.PORT=8080 (a number): PORT=%q, want the text 8080", got)
	}
	if _, err := render(t, "--set", "env.PORT.x=1"); err == nil || !strings.Contains(err.Error(), "/env/PORT") {
		t.Errorf("env.PORT.x=1 (an object): got %v, want the schema to refuse it", err)
	}
}

// TestEnvOfThePluginsSettingsIsNotLostSilently: Istio's chart passes its env value to
// install-cni, which builds the plugin's entry from EXCLUDE_NAMESPACES, NATIVE_NFTABLES
// and the rest; this chart gives the agent the entry ready-made (CNI_NETWORK_CONFIG),
// which the agent does not merge them into. Such a variable in env either reaches the
// plugin's installed config or is refused at render, naming it.
func TestEnvOfThePluginsSettingsIsNotLostSilently(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		reached     func(c *plugin.Config) bool
	}{
		{"EXCLUDE_NAMESPACES", `kube-system\,mesh-ops`, func(c *plugin.Config) bool { return slices.Contains(c.ExcludeNamespaces, "mesh-ops") }},
		{"EXCLUDED_NAMESPACES", "mesh-ops", func(c *plugin.Config) bool { return slices.Contains(c.ExcludeNamespaces, "mesh-ops") }},
		{"NATIVE_NFTABLES", "true", func(c *plugin.Config) bool { return c.Backend == plugin.BackendNftables }},
		{"PLUGIN_LOG_LEVEL", "debug", func(c *plugin.Config) bool { return c.LogLevel == cli.LevelDebug }},
		{"LOG_LEVEL", "debug", func(c *plugin.Config) bool { return c.LogLevel == cli.LevelDebug }},
		{"IPTABLES_MODE", "legacy", func(c *plugin.Config) bool { return c.IptablesMode == iptables.ModeLegacy }},
		{"AGENT_LOG_AS_JSON", "true", func(c *plugin.Config) bool { return c.LogJSON }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := render(t, "--set-string", "env."+tc.name+"="+tc.value)
			if err != nil {
				if !strings.Contains(err.Error(), "env."+tc.name) {
					t.Errorf("env.%s refused without naming it: %v", tc.name, err)
				}
				return
			}
			if c := renderedPluginConfig(t, m); !tc.reached(c) {
				t.Errorf("env.%s=%s renders, but the plugin's installed config does not have it", tc.name, tc.value)
			}
		})
	}
}
