package kube

import (
	"strings"
	"testing"
)

func TestIsDNSLabel(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"istio-system", true},
		{"a", true},
		{"0abc9", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"-a", false},
		{"a-", false},
		{"Istio", false},
		{"a.b", false},
		{"a_b", false},
		{"ä", false},
	}
	for _, tc := range cases {
		if got := IsDNSLabel(tc.in); got != tc.want {
			t.Errorf("IsDNSLabel(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
