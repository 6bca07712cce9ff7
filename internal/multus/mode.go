package multus

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/istio-cni/istio-cni/internal/settings"
)

// Environment variables (ours: Istio's install-cni has no Multus settings).
const (
	EnvEnabled     = "MULTUS_ENABLED"
	EnvNetworkName = "MULTUS_NETWORK_NAME"
)

// DefaultNetworkName is the chart's NetworkAttachmentDefinition, and the network
// name of the plugin's standalone config.
const DefaultNetworkName = "istio-cni"

// Mode says whether pods join the plugin through Multus, and by which network.
type Mode struct {
	// Enabled: pods reach the plugin only when their k8s.v1.cni.cncf.io/networks
	// annotation names Network (MULTUS_ENABLED, default false).
	Enabled bool
	// Network is the NetworkAttachmentDefinition's name (MULTUS_NETWORK_NAME,
	// default istio-cni).
	Network string
}

// DefaultMode is off, with the chart's network name.
func DefaultMode() Mode { return Mode{Network: DefaultNetworkName} }

// Read sets m from MULTUS_ENABLED and MULTUS_NETWORK_NAME.
func (m *Mode) Read(r *settings.Reader) {
	r.Bool(EnvEnabled, &m.Enabled)
	r.NonEmpty(EnvNetworkName, &m.Network)
}

// Check adds to p what is wrong with m, naming the variable.
func (m Mode) Check(p *settings.Problems) {
	if !m.Enabled {
		return
	}
	if msgs := validation.IsDNS1123Subdomain(m.Network); len(msgs) > 0 {
		p.Add(EnvNetworkName, "%q is not a NetworkAttachmentDefinition name: %s", m.Network, strings.Join(msgs, "; "))
	}
}
