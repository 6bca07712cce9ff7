package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/multus"
)

// MultusNetworksAnnotation names the extra networks Multus attaches to a pod; on
// OpenShift Istio's injector adds istio-cni to it.
const MultusNetworksAnnotation = multus.NetworksAnnotation

// MultusCheck is what a standalone (Multus) istio-cni needs per pod: the pod asks
// for the network, and its NetworkAttachmentDefinition exists.
type MultusCheck struct {
	// Network is the network name the plugin's config carries (its NAD's name).
	Network    string `json:"network"`
	Annotation string `json:"annotation,omitempty"`
	// Requested: the annotation names the network; NADNamespace is where Multus
	// looks for it (the annotation's namespace, else the pod's).
	Requested    bool   `json:"requested"`
	NADNamespace string `json:"nadNamespace,omitempty"`
	// NADExists is nil when it could not be checked (Error says why).
	NADExists *bool    `json:"nadExists,omitempty"`
	Problems  []string `json:"problems,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// NetworkSelection is one network of the annotation.
type NetworkSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// ParseNetworks reads the Multus annotation in both of its forms, as the agent's
// repair controller does (multus.ParseNetworks).
func ParseNetworks(v string) ([]NetworkSelection, error) {
	nets, err := multus.ParseNetworks(v)
	if err != nil {
		return nil, err
	}
	var out []NetworkSelection
	for _, n := range nets {
		out = append(out, NetworkSelection{Name: n.Name, Namespace: n.Namespace})
	}
	return out, nil
}

// NADPath is the API path of a NetworkAttachmentDefinition.
func NADPath(namespace, name string) string {
	return "/apis/k8s.cni.cncf.io/v1/namespaces/" + url.PathEscape(namespace) + "/network-attachment-definitions/" + url.PathEscape(name)
}

// CheckMultus checks that pod requests the network and that its
// NetworkAttachmentDefinition exists where Multus looks for it.
func CheckMultus(ctx context.Context, c *kube.Client, pod *kube.Pod, network string) *MultusCheck {
	m := &MultusCheck{Network: network, Annotation: pod.Metadata.Annotations[MultusNetworksAnnotation]}
	sels, err := ParseNetworks(m.Annotation)
	if err != nil {
		m.Problems = append(m.Problems, err.Error()+": Multus fails the pod's sandbox")
		return m
	}
	for _, s := range sels {
		if s.Name == network {
			m.Requested = true
			m.NADNamespace = s.Namespace
			if m.NADNamespace == "" {
				m.NADNamespace = pod.Metadata.Namespace
			}
			break
		}
	}
	if !m.Requested {
		what := fmt.Sprintf("it is %q", m.Annotation)
		if m.Annotation == "" {
			what = "the pod has none"
		}
		m.Problems = append(m.Problems, fmt.Sprintf("annotation %s does not name the %s network (%s): Multus never runs istio-cni for this pod, so its traffic is not redirected "+
			"(Istio's injector adds it on OpenShift; re-create the pod, or check the injection template)", MultusNetworksAnnotation, network, what))
		return m
	}
	var nad struct {
		Metadata kube.ObjectMeta `json:"metadata"`
	}
	err = c.Get(ctx, NADPath(m.NADNamespace, network), &nad)
	switch {
	case err == nil:
		m.NADExists = boolPtr(true)
	case errors.Is(err, kube.ErrNotFound):
		m.NADExists = boolPtr(false)
		var probe map[string]any
		if gerr := c.Get(ctx, "/apis/k8s.cni.cncf.io/v1", &probe); errors.Is(gerr, kube.ErrNotFound) {
			m.Problems = append(m.Problems, "the NetworkAttachmentDefinition API (k8s.cni.cncf.io/v1) is not installed: Multus is not set up in this cluster")
		} else {
			m.Problems = append(m.Problems, fmt.Sprintf("NetworkAttachmentDefinition %s/%s is missing: Multus fails the pod's sandbox (ContainerCreating); "+
				"create it in namespace %s (the chart does for each namespace in multus.namespaces, with multus.enabled)", m.NADNamespace, network, m.NADNamespace))
		}
	default:
		m.Error = fmt.Sprintf("cannot check NetworkAttachmentDefinition %s/%s: %v (the agent's own kubeconfig may only get pods: pass --kubeconfig)", m.NADNamespace, network, err)
	}
	return m
}

func boolPtr(b bool) *bool { return &b }
