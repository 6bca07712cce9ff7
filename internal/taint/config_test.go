package taint

import (
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/envmap"
)

var env = envmap.Lookup

func TestConfigFromEnv(t *testing.T) {
	c, err := ConfigFromEnv(env(EnvEnabled, "true", EnvPodNamespace, "kube-system", EnvPodName, "taint-7f9"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Key != "cni.istio.io/not-ready" || c.Effect != "NoSchedule" || c.AgentNamespace != "kube-system" ||
		c.AgentSelector != "k8s-app=istio-cni-node" || c.Identity != "taint-7f9" || c.LeaseDuration != 15*time.Second {
		t.Errorf("defaults: %+v", c)
	}
	c, err = ConfigFromEnv(env(EnvEnabled, "true", EnvPodName, "p", EnvKey, "example.com/cni", EnvEffect, "PreferNoSchedule",
		EnvAgentNamespace, "cni", EnvAgentSelector, "app=cni", EnvNodeSelector, "kubernetes.io/os=linux", EnvLeaseName, "l",
		EnvLeaseDuration, "30s", EnvRenewDeadline, "20s", EnvRetryPeriod, "5s", EnvIdentity, "me"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Key != "example.com/cni" || c.Effect != "PreferNoSchedule" || c.AgentNamespace != "cni" || c.NodeSelector != "kubernetes.io/os=linux" ||
		c.Identity != "me" || c.RetryPeriod != 5*time.Second {
		t.Errorf("settings not read: %+v", c)
	}
	if _, err := ConfigFromEnv(env()); err != nil {
		t.Errorf("disabled by default, yet rejected: %v", err)
	}
}

func TestConfigRejectsBadSettingsNamingThem(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{EnvEnabled, "maybe"}, []string{EnvEnabled}},
		{[]string{EnvEnabled, "true"}, []string{EnvIdentity, EnvPodName}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvKey, "bad key!", EnvEffect, "Never"}, []string{EnvKey, EnvEffect, "Never"}},
		// NoExecute would evict the node's pods at every agent restart: refused, saying so.
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvEffect, "NoExecute"}, []string{EnvEffect, "NoExecute", "evict", "NoSchedule"}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvAgentSelector, ""}, []string{EnvAgentSelector}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvNodeSelector, "a in ("}, []string{EnvNodeSelector}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvLeaseDuration, "5s", EnvRenewDeadline, "10s"}, []string{EnvLeaseDuration}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvLeaseDuration, "30s", EnvRenewDeadline, "20s", EnvRetryPeriod, "15s"}, []string{EnvLeaseDuration, EnvRenewDeadline, EnvRetryPeriod}},
		{[]string{EnvEnabled, "true", EnvPodName, "p", EnvRetryPeriod, "soon"}, []string{EnvRetryPeriod}},
	} {
		envmap.CheckRejected(t, ConfigFromEnv, tc.env, tc.want...)
	}
}
