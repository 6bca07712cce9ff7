package kube

import "net/url"

// Namespace is the part of a core/v1 Namespace that the CNI plugin reads: its
// labels (Istio's ambient mode is switched on per namespace by a label). Fields it
// does not declare are ignored.
type Namespace struct {
	Metadata ObjectMeta `json:"metadata"`
}

// NamespacePath is the API path of a namespace.
func NamespacePath(name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(name)
}
