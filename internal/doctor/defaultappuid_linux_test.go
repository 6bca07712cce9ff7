package doctor

import (
	"testing"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// TestDefaultAppUIDIsNotTheProxys: the probe's default application uid is the
// first app container's, unless the plan exempts it as the proxy's (its uid or
// gid, whatever the plugin took them to be, not 1337 alone), then 1000.
func TestDefaultAppUIDIsNotTheProxys(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	pod := func(app, podLevel *int64) *kube.Pod {
		p := &kube.Pod{Spec: kube.PodSpec{Containers: []kube.Container{
			{Name: "istio-proxy"}, {Name: "app", SecurityContext: &kube.SecurityContext{RunAsUser: app}},
		}}}
		if podLevel != nil {
			p.Spec.SecurityContext = &kube.PodSecurityContext{RunAsUser: podLevel}
		}
		return p
	}
	spec := func(uids, gids []uint32) redirect.Spec {
		s := redirect.DefaultSpec()
		s.ProxyUIDs, s.ProxyGIDs = uids, gids
		return s
	}
	for _, tc := range []struct {
		name string
		pod  *kube.Pod
		spec redirect.Spec
		want uint32
	}{
		{"the app's own uid", pod(i64(2000), nil), spec([]uint32{1337}, []uint32{1337}), 2000},
		{"inherited from the pod", pod(nil, i64(2500)), spec([]uint32{1337}, []uint32{1337}), 2500},
		{"none set", pod(nil, nil), spec([]uint32{1337}, []uint32{1337}), 1000},
		{"root", pod(i64(0), nil), spec([]uint32{1337}, []uint32{1337}), 1000},
		{"the default proxy uid", pod(i64(1337), nil), spec([]uint32{1337}, []uint32{1337}), 1000},
		{"istio-proxy's own uid", pod(i64(5000), nil), spec([]uint32{5000}, []uint32{1337}), 1000},
		{"an extra bypass uid", pod(i64(6000), nil), spec([]uint32{5000, 6000}, []uint32{1337}), 1000},
		{"the proxy's gid", pod(i64(5001), nil), spec([]uint32{5000}, []uint32{5001}), 1000},
		{"1337 when the proxy is another uid", pod(i64(1337), nil), spec([]uint32{5000}, []uint32{5001}), 1337},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultAppUID(tc.pod, tc.spec); got != tc.want {
				t.Errorf("defaultAppUID = %d, want %d", got, tc.want)
			}
		})
	}
}
