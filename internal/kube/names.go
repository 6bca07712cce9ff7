package kube

import "strings"

// IsDNSLabel reports whether v is an RFC 1123 label, the form of a namespace name:
// at most 63 lower-case letters, digits and '-', starting and ending with a letter
// or digit. It is k8s.io/apimachinery's IsDNS1123Label without the messages, so
// that the plugin does not link apimachinery.
func IsDNSLabel(v string) bool {
	if v == "" || len(v) > 63 {
		return false
	}
	for i, c := range v {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(v)-1) {
			return false
		}
	}
	return true
}

// IsDNSSubdomain reports whether v is an RFC 1123 subdomain, the form of most object
// names (a ServiceAccount's among them): at most 253 characters, labels joined by '.'.
func IsDNSSubdomain(v string) bool {
	if v == "" || len(v) > 253 {
		return false
	}
	for label := range strings.SplitSeq(v, ".") {
		if !IsDNSLabel(label) {
			return false
		}
	}
	return true
}
