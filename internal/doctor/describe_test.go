package doctor

import (
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

func TestDescribeSaysWhichGroupsAreCaptured(t *testing.T) {
	cases := []struct {
		name   string
		groups redirect.GroupFilter
		want   string // a line of the description; "" for no group line
	}{
		{"every group", redirect.GroupFilter{Except: true}, ""},
		{"an empty include list captures no group", redirect.GroupFilter{}, "outbound of no group captured (an empty include list)"},
		{"an include list", redirect.GroupFilter{Groups: []string{"java", "202"}}, "outbound captured only for groups 202,java"},
		{"an exclude list", redirect.GroupFilter{Except: true, Groups: []string{"ftp"}}, "outbound of groups ftp not captured"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := redirect.DefaultSpec()
			s.OwnerGroups = tc.groups
			lines := Describe(s)
			var got string
			for _, l := range lines {
				if strings.HasPrefix(l, "outbound of") || strings.HasPrefix(l, "outbound captured only") {
					got = l
				}
			}
			if got != tc.want {
				t.Errorf("group line = %q, want %q\nall lines: %q", got, tc.want, lines)
			}
		})
	}
}
