package istioiptables

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// TestRemovalTakesTProxyRoutingWithoutInboundPorts: the apply adds TPROXY's routing
// only with inbound ports, but --cleanup-only in TPROXY mode removes it whatever
// ports it is given, since an earlier apply may have added it.
func TestRemovalTakesTProxyRoutingWithoutInboundPorts(t *testing.T) {
	cases := []struct {
		name string
		set  func(s *redirect.Spec)
		want *redirect.Routing
	}{
		{"REDIRECT: no routing", func(s *redirect.Spec) {}, nil},
		{"TPROXY with inbound ports: the plan's routing", func(s *redirect.Spec) {
			s.Mode, s.InboundPorts, s.TProxyMark = redirect.ModeTProxy, redirect.PortSet{All: true}, 7
		}, &redirect.Routing{Mark: 7, Table: redirect.DefaultTProxyRouteTable}},
		{"TPROXY without inbound ports: the routing an apply with ports added", func(s *redirect.Spec) {
			s.Mode, s.TProxyRouteTable = redirect.ModeTProxy, 200
		}, &redirect.Routing{Mark: redirect.DefaultTProxyMark, Table: 200}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := redirect.DefaultSpec()
			tc.set(&spec)
			plan, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, removalPlan(spec, plan).Routing); diff != "" {
				t.Errorf("removal routing (-want +got):\n%s", diff)
			}
		})
	}
}
