package chart

import (
	"strings"
	"testing"
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
