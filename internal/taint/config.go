package taint

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/istio-cni/istio-cni/internal/lease"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// Environment variables (ours: Istio has no agent-side equivalent; its istiod
// untaint controller is switched on by PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS and
// names the taint with PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME).
const (
	EnvEnabled        = "TAINT_ENABLED"
	EnvKey            = "TAINT_KEY"
	EnvEffect         = "TAINT_EFFECT"
	EnvAgentNamespace = "TAINT_AGENT_NAMESPACE"
	EnvAgentSelector  = "TAINT_AGENT_LABEL_SELECTOR"
	EnvNodeSelector   = "TAINT_NODE_LABEL_SELECTOR"
	EnvLeaseName      = "TAINT_LEASE_NAME"
	EnvLeaseDuration  = "TAINT_LEASE_DURATION"
	EnvRenewDeadline  = "TAINT_RENEW_DEADLINE"
	EnvRetryPeriod    = "TAINT_RETRY_PERIOD"
	EnvIdentity       = "TAINT_IDENTITY"
	EnvPodNamespace   = "POD_NAMESPACE"  // the default agent and lease namespace
	EnvPodName        = lease.EnvPodName // the default identity
)

var leaseEnvs = lease.Envs{
	LeaseName: EnvLeaseName, LeaseDuration: EnvLeaseDuration, RenewDeadline: EnvRenewDeadline,
	RetryPeriod: EnvRetryPeriod, Identity: EnvIdentity,
}

// Defaults, Istio's where Istio has one.
const (
	DefaultKey            = "cni.istio.io/not-ready"
	DefaultEffect         = corev1.TaintEffectNoSchedule
	DefaultAgentNamespace = "istio-system"
	DefaultAgentSelector  = "k8s-app=istio-cni-node"
	DefaultLeaseName      = "istio-cni-taint"
)

// Config is the node readiness controller's settings.
type Config struct {
	// Enabled runs it (TAINT_ENABLED, default false).
	Enabled bool
	// Key and Effect are the taint (TAINT_KEY, default cni.istio.io/not-ready;
	// TAINT_EFFECT, default NoSchedule, or PreferNoSchedule; NoExecute is refused,
	// it would evict the node's pods at every agent restart). The taint's value is
	// "true".
	Key    string
	Effect corev1.TaintEffect
	// AgentNamespace and AgentSelector find the agent pods (TAINT_AGENT_NAMESPACE,
	// default POD_NAMESPACE or istio-system; TAINT_AGENT_LABEL_SELECTOR, default
	// k8s-app=istio-cni-node, the label Istio's untaint controller looks for).
	AgentNamespace string
	AgentSelector  string
	// NodeSelector limits the managed nodes to those the agent runs on
	// (TAINT_NODE_LABEL_SELECTOR, default all): a node the DaemonSet never reaches
	// would otherwise stay tainted forever.
	NodeSelector string
	// Config is the leader election's (TAINT_LEASE_NAME in AgentNamespace,
	// TAINT_LEASE_DURATION, TAINT_RENEW_DEADLINE, TAINT_RETRY_PERIOD; client-go's
	// usual 15s, 10s and 2s; TAINT_IDENTITY, default POD_NAME).
	lease.Config
}

// DefaultConfig is disabled, with Istio's taint and agent label.
func DefaultConfig() Config {
	return Config{
		Key:            DefaultKey,
		Effect:         DefaultEffect,
		AgentNamespace: DefaultAgentNamespace,
		AgentSelector:  DefaultAgentSelector,
		Config:         lease.Defaults(DefaultLeaseName, 1), // client-go's usual timings
	}
}

// ConfigFromEnv reads the settings through lookup over DefaultConfig and validates
// them; every error names the variable.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	return settings.FromEnv(lookup, DefaultConfig(), func(r *settings.Reader, c *Config) {
		r.Bool(EnvEnabled, &c.Enabled)
		r.NonEmpty(EnvKey, &c.Key)
		var effect string
		r.NonEmpty(EnvEffect, &effect)
		if effect != "" {
			c.Effect = corev1.TaintEffect(effect)
		}
		r.NonEmpty(EnvPodNamespace, &c.AgentNamespace)
		r.NonEmpty(EnvAgentNamespace, &c.AgentNamespace)
		r.String(EnvAgentSelector, &c.AgentSelector)
		r.String(EnvNodeSelector, &c.NodeSelector)
		c.Config.Read(r, leaseEnvs)
	})
}

// Validate reports every bad setting, each naming its variable.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var p settings.Problems
	if msgs := keyProblems(c.Key); len(msgs) > 0 {
		p.Add(EnvKey, "%q is not a taint key: %s", c.Key, strings.Join(msgs, "; "))
	}
	switch c.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule:
	case corev1.TaintEffectNoExecute:
		// The taint goes on whenever an agent is not ready: on every agent restart
		// and node reboot, NoExecute would evict every pod there that does not
		// tolerate it, although the plugin is still installed and those pods are
		// captured. Keeping new pods off is all the taint is for.
		p.Add(EnvEffect, "NoExecute is refused: the taint is set each time a node's agent is not ready (every restart or reboot), and NoExecute would evict the node's running pods then; use NoSchedule, which keeps new pods off the node without evicting running ones")
	default:
		p.Add(EnvEffect, "%q is not a taint effect this controller sets (NoSchedule, PreferNoSchedule)", c.Effect)
	}
	if msgs := validation.IsDNS1123Label(c.AgentNamespace); len(msgs) > 0 {
		p.Add(EnvAgentNamespace, "%q is not a namespace: %s", c.AgentNamespace, strings.Join(msgs, "; "))
	}
	if sel, err := labels.Parse(c.AgentSelector); err != nil {
		p.Add(EnvAgentSelector, "%q is not a label selector: %v", c.AgentSelector, err)
	} else if sel.Empty() {
		p.Add(EnvAgentSelector, "empty: every pod in %s would count as the agent", c.AgentNamespace)
	}
	if _, err := labels.Parse(c.NodeSelector); err != nil {
		p.Add(EnvNodeSelector, "%q is not a label selector: %v", c.NodeSelector, err)
	}
	c.Config.Check(&p, leaseEnvs)
	return p.Err()
}
