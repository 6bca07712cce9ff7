package multus

import (
	"encoding/json"
	"fmt"
	"strings"
)

// NetworksAnnotation is the pod annotation through which Multus attaches extra
// networks (the Network Plumbing Working Group's name).
const NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"

// Network is one network a pod asks for: a NetworkAttachmentDefinition's name,
// and its namespace when the annotation names one (empty: the pod's own).
type Network struct {
	Namespace string
	Name      string
}

// ParseNetworks reads the annotation's value in either of Multus' two forms: a
// comma-separated list of [namespace/]name[@interface], or a JSON list of objects
// with "name" and optionally "namespace" (other fields are ignored). As Multus, it
// takes a value holding any of [ { " for JSON, and refuses an empty item.
func ParseNetworks(value string) ([]Network, error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return nil, nil
	}
	if strings.ContainsAny(value, `[{"`) {
		var list []struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		}
		if err := json.Unmarshal([]byte(value), &list); err != nil {
			return nil, fmt.Errorf("%s %q: not a JSON list of networks: %w", NetworksAnnotation, value, err)
		}
		out := make([]Network, 0, len(list))
		for i, n := range list {
			if strings.TrimSpace(n.Name) == "" {
				return nil, fmt.Errorf("%s %q: entry %d has no name", NetworksAnnotation, value, i)
			}
			out = append(out, Network{Namespace: strings.TrimSpace(n.Namespace), Name: strings.TrimSpace(n.Name)})
		}
		return out, nil
	}
	var out []Network
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if at := strings.LastIndex(item, "@"); at >= 0 {
			item = item[:at]
		}
		var n Network
		if slash := strings.Index(item, "/"); slash >= 0 {
			n.Namespace, n.Name = item[:slash], item[slash+1:]
		} else {
			n.Name = item
		}
		if n.Name == "" || strings.Contains(n.Name, "/") {
			return nil, fmt.Errorf("%s %q: %q is not [namespace/]name[@interface]", NetworksAnnotation, value, item)
		}
		out = append(out, n)
	}
	return out, nil
}

// Attaches reports whether a pod with these annotations asks Multus for network,
// in whatever namespace; an annotation that does not parse asks for nothing, and
// the error says why.
func Attaches(annotations map[string]string, network string) (bool, error) {
	nets, err := ParseNetworks(annotations[NetworksAnnotation])
	for _, n := range nets {
		if n.Name == network {
			return true, nil
		}
	}
	return false, err
}

// AttachesHere reports whether a pod in namespace asks for network from its own
// namespace: the NetworkAttachmentDefinition it needs is there.
func AttachesHere(annotations map[string]string, namespace, network string) bool {
	nets, _ := ParseNetworks(annotations[NetworksAnnotation])
	for _, n := range nets {
		if n.Name == network && (n.Namespace == "" || n.Namespace == namespace) {
			return true
		}
	}
	return false
}
