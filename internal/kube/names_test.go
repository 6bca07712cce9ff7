package kube

import (
	"strings"
	"testing"
)

func TestIsDNSLabel(t *testing.T) {
	labels := []string{"istio-system", "a", "0abc9", strings.Repeat("a", 63)}
	notLabels := []string{"", strings.Repeat("a", 64), "-a", "a-", "Istio", "a.b", "a_b", "ä"}
	for _, v := range labels {
		if !IsDNSLabel(v) {
			t.Errorf("IsDNSLabel(%q) = false, want true", v)
		}
	}
	for _, v := range notLabels {
		if IsDNSLabel(v) {
			t.Errorf("IsDNSLabel(%q) = true, want false", v)
		}
	}
}
