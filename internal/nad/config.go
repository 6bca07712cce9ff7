package nad

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/validation/path"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/istio-cni/istio-cni/internal/lease"
	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// Environment variables (ours: Istio's install-cni has no Multus settings).
// MULTUS_ENABLED and MULTUS_NETWORK_NAME are package multus'.
const (
	EnvMeshedNamespaces = "MULTUS_MESHED_NAMESPACES"
	EnvStaticNamespaces = "MULTUS_STATIC_NAMESPACES"
	EnvOwnerClusterRole = "MULTUS_NAD_OWNER_CLUSTERROLE"
	EnvLeaseName        = "MULTUS_LEASE_NAME"
	EnvLeaseDuration    = "MULTUS_LEASE_DURATION"
	EnvRenewDeadline    = "MULTUS_RENEW_DEADLINE"
	EnvRetryPeriod      = "MULTUS_RETRY_PERIOD"
	EnvIdentity         = "MULTUS_IDENTITY"
	EnvPodNamespace     = "POD_NAMESPACE" // the Lease's namespace
)

var leaseEnvs = lease.Envs{
	LeaseName: EnvLeaseName, LeaseDuration: EnvLeaseDuration, RenewDeadline: EnvRenewDeadline,
	RetryPeriod: EnvRetryPeriod, Identity: EnvIdentity,
}

// Defaults. The Lease's timings are four times client-go's usual ones
// (leaseSlower): every agent of the DaemonSet campaigns, and each one reads the
// Lease every RetryPeriod, while a slower take-over only delays the object in a
// namespace that gets its first meshed pod in that window.
const (
	DefaultLeaseName = "istio-cni-multus"
	leaseSlower      = 4
	// SidecarAnnotation marks a pod Istio's injector has given a sidecar.
	SidecarAnnotation = "sidecar.istio.io/status"
	// ManagedByLabel marks the NetworkAttachmentDefinitions the controller created.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "istio-cni-node"
)

// Config is the agent's Multus settings.
type Config struct {
	// Mode says pods join the plugin through Multus, by the pod annotation
	// k8s.v1.cni.cncf.io/networks naming Network, the NetworkAttachmentDefinition
	// kept here (MULTUS_ENABLED, MULTUS_NETWORK_NAME). The repair controller reads
	// it too, and reports meshed pods whose annotation lacks the network.
	multus.Mode
	// MeshedNamespaces runs the controller that keeps the NetworkAttachmentDefinition
	// in every namespace with meshed pods or labelled for injection
	// (MULTUS_MESHED_NAMESPACES, default false; needs Enabled).
	MeshedNamespaces bool
	// StaticNamespaces are left to whoever creates the object there (the chart's
	// multus.namespaces): the controller creating one first would make helm's own
	// create fail (MULTUS_STATIC_NAMESPACES, comma-separated).
	StaticNamespaces []string
	// OwnerClusterRole names the cluster-scoped owner of the objects the controller
	// creates, so that deleting it (uninstalling the chart) deletes them
	// (MULTUS_NAD_OWNER_CLUSTERROLE; empty: no owner, the objects stay).
	OwnerClusterRole string
	// LeaseNamespace holds the Lease (POD_NAMESPACE).
	LeaseNamespace string
	// Config is the election's: MULTUS_LEASE_NAME (istio-cni-multus),
	// MULTUS_LEASE_DURATION, MULTUS_RENEW_DEADLINE, MULTUS_RETRY_PERIOD (60s, 40s,
	// 8s), MULTUS_IDENTITY (default POD_NAME).
	lease.Config
}

// DefaultConfig is off, with the chart's network name.
func DefaultConfig() Config {
	return Config{
		Mode:   multus.DefaultMode(),
		Config: lease.Defaults(DefaultLeaseName, leaseSlower),
	}
}

// ConfigFromEnv reads the settings through lookup over DefaultConfig and validates
// them; every error names the variable.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	return settings.FromEnv(lookup, DefaultConfig(), func(r *settings.Reader, c *Config) {
		c.Mode.Read(r)
		r.Bool(EnvMeshedNamespaces, &c.MeshedNamespaces)
		var static string
		r.String(EnvStaticNamespaces, &static)
		c.StaticNamespaces = nil
		for _, ns := range strings.Split(static, ",") {
			if ns = strings.TrimSpace(ns); ns != "" && !slices.Contains(c.StaticNamespaces, ns) {
				c.StaticNamespaces = append(c.StaticNamespaces, ns)
			}
		}
		r.String(EnvOwnerClusterRole, &c.OwnerClusterRole)
		r.String(EnvPodNamespace, &c.LeaseNamespace)
		c.Config.Read(r, leaseEnvs)
	})
}

// Validate reports every bad setting, each naming its variable.
func (c Config) Validate() error {
	var p settings.Problems
	c.Mode.Check(&p)
	if c.MeshedNamespaces && !c.Enabled {
		p.Add(EnvMeshedNamespaces, "true, but %s is false: the NetworkAttachmentDefinition is only used through Multus", multus.EnvEnabled)
	}
	if !c.MeshedNamespaces || !c.Enabled {
		return p.Err()
	}
	for _, ns := range c.StaticNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			p.Add(EnvStaticNamespaces, "%q is not a namespace: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if c.OwnerClusterRole != "" {
		if msgs := path.IsValidPathSegmentName(c.OwnerClusterRole); len(msgs) > 0 {
			p.Add(EnvOwnerClusterRole, "%q is not a ClusterRole name: %s", c.OwnerClusterRole, strings.Join(msgs, "; "))
		}
	}
	if msgs := validation.IsDNS1123Label(c.LeaseNamespace); len(msgs) > 0 {
		p.Add(EnvPodNamespace, "%q is not a namespace (the Lease's): %s", c.LeaseNamespace, strings.Join(msgs, "; "))
	}
	c.Config.Check(&p, leaseEnvs)
	return p.Err()
}
