package plugin

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/kube"
)

func withPodSecurity(uid, gid *int64) func(p *kube.Pod) {
	return func(p *kube.Pod) { p.Spec.SecurityContext = &kube.PodSecurityContext{RunAsUser: uid, RunAsGroup: gid} }
}

// withContainerSecurity sets the security context of the container or init
// container called name.
func withContainerSecurity(name string, uid, gid *int64) func(p *kube.Pod) {
	return func(p *kube.Pod) {
		for _, cs := range [][]kube.Container{p.Spec.InitContainers, p.Spec.Containers} {
			for i := range cs {
				if cs[i].Name == name {
					cs[i].SecurityContext = &kube.SecurityContext{RunAsUser: uid, RunAsGroup: gid}
					return
				}
			}
		}
		panic("no container " + name)
	}
}

func withInitContainer(name string) func(p *kube.Pod) {
	return func(p *kube.Pod) { p.Spec.InitContainers = append(p.Spec.InitContainers, kube.Container{Name: name}) }
}

// TestProxyIdentity is the decision of the proxy's uid and gid: where each comes
// from, the other containers that run as it (warned of) and the pod-level id
// another container shares (refused, naming the pod's security context, the
// containers and the fix).
func TestProxyIdentity(t *testing.T) {
	ownApp := withContainerSecurity("app", int64p(1000), int64p(1000))
	for _, tc := range []struct {
		name     string
		pod      *kube.Pod
		uid, gid uint32
		shared   []SharedProxyID
		// errs are the parts the refusal must hold; none: no refusal.
		errs []string
	}{
		{name: "default when nothing sets it", pod: injectedPod(), uid: 1337, gid: 1337},
		{name: "from istio-proxy's security context", pod: injectedPod(withProxySecurity(int64p(5000), int64p(5001))), uid: 5000, gid: 5001},
		{name: "from the pod when istio-proxy sets none and every container sets its own",
			pod: injectedPod(withPodSecurity(int64p(2000), int64p(3000)), ownApp, withContainerSecurity("istio-validation", int64p(1337), int64p(1337))),
			uid: 2000, gid: 3000},
		{name: "istio-validation inheriting the pod's id is not another container",
			pod: injectedPod(withPodSecurity(int64p(2000), int64p(3000)), ownApp), uid: 2000, gid: 3000},
		{name: "istio-validation running as the proxy's id by design is not warned of",
			pod: injectedPod(withContainerSecurity("istio-validation", int64p(1337), int64p(1337))), uid: 1337, gid: 1337},
		{name: "pod's uid inherited by an app container is refused",
			pod: injectedPod(withPodSecurity(int64p(2000), nil)),
			errs: []string{"istio-proxy sets no securityContext.runAsUser", "the pod's securityContext.runAsUser, 2000",
				"the container app runs as uid 2000 too", "bypass the proxy", "set istio-proxy's securityContext.runAsUser", "Istio's injector sets 1337"}},
		{name: "pod's uid inherited by an init container is refused",
			pod:  injectedPod(withPodSecurity(int64p(2000), nil), withContainerSecurity("app", int64p(1000), nil), withInitContainer("setup")),
			errs: []string{"the pod's securityContext.runAsUser, 2000", "the container setup (init) runs as uid 2000 too"}},
		{name: "pod's uid inherited by an init container and an app container names both",
			pod:  injectedPod(withPodSecurity(int64p(2000), nil), withInitContainer("setup")),
			errs: []string{"the containers setup (init) and app run as uid 2000 too: the capture would exempt their traffic"}},
		{name: "pod's uid set by another container as its own is refused",
			pod:  injectedPod(withPodSecurity(int64p(2000), nil), withContainerSecurity("app", int64p(2000), nil)),
			errs: []string{"the container app runs as uid 2000 too"}},
		{name: "pod's uid of 1337 inherited by an app container is refused",
			pod:  injectedPod(withPodSecurity(int64p(1337), nil)),
			errs: []string{"the pod's securityContext.runAsUser, 1337", "the container app runs as uid 1337 too"}},
		{name: "pod's gid inherited by an app container is refused",
			pod: injectedPod(withPodSecurity(nil, int64p(3000)), withProxySecurity(int64p(1337), nil)),
			errs: []string{"istio-proxy sets no securityContext.runAsGroup", "the pod's securityContext.runAsGroup, 3000",
				"the container app runs as gid 3000 too", "set istio-proxy's securityContext.runAsGroup"}},
		{name: "pod's uid and gid both shared: both refused",
			pod:  injectedPod(withPodSecurity(int64p(2000), int64p(3000))),
			errs: []string{"securityContext.runAsUser, 2000", "securityContext.runAsGroup, 3000"}},
		{name: "native sidecar: the proxy itself is not another container",
			pod: injectedPod(nativeSidecar, withPodSecurity(int64p(2000), int64p(3000)), ownApp), uid: 2000, gid: 3000},
		{name: "native sidecar with the pod's uid shared is refused",
			pod:  injectedPod(nativeSidecar, withPodSecurity(int64p(2000), nil)),
			errs: []string{"the container app runs as uid 2000 too"}},
		{name: "pod's uid 0 is the default, and root is not the proxy",
			pod: injectedPod(withPodSecurity(int64p(0), int64p(0))), uid: 1337, gid: 1337},
		{name: "pod's out-of-range uid is the default, and is not the proxy's",
			pod: injectedPod(withPodSecurity(int64p(1<<32), int64p(1<<32+1337))), uid: 1337, gid: 1337},
		{name: "pod's uid 0 is the default: a container running as 1337 is warned of, not refused",
			pod: injectedPod(withPodSecurity(int64p(0), nil), withContainerSecurity("app", int64p(1337), nil)), uid: 1337, gid: 1337,
			shared: []SharedProxyID{{Container: "app", Kind: "uid", ID: 1337, Own: true}}},
		{name: "pod's out-of-range gid is the default: a container running as 1337 is warned of, not refused",
			pod: injectedPod(withPodSecurity(nil, int64p(1<<32)), withContainerSecurity("app", nil, int64p(1337))), uid: 1337, gid: 1337,
			shared: []SharedProxyID{{Container: "app", Kind: "gid", ID: 1337, Own: true}}},
		{name: "pod's negative uid is the default",
			pod: injectedPod(withPodSecurity(int64p(-1), nil)), uid: 1337, gid: 1337},
		{name: "istio-proxy's uid 0 is the default even with a pod-level uid, which is not then the proxy's",
			pod: injectedPod(withProxySecurity(int64p(0), int64p(0)), withPodSecurity(int64p(2000), int64p(3000))), uid: 1337, gid: 1337},
		{name: "istio-proxy's out-of-range uid is the default even with a pod-level uid",
			pod: injectedPod(withProxySecurity(int64p(1<<32), nil), withPodSecurity(int64p(2000), nil)), uid: 1337, gid: 1337},
		{name: "an app container running as the default uid explicitly is warned of",
			pod: injectedPod(withContainerSecurity("app", int64p(1337), nil)), uid: 1337, gid: 1337,
			shared: []SharedProxyID{{Container: "app", Kind: "uid", ID: 1337, Own: true}}},
		{name: "an init container running as istio-proxy's uid and gid is warned of for each",
			pod: injectedPod(withProxySecurity(int64p(5000), int64p(5001)), withInitContainer("vault-agent-init"), withContainerSecurity("vault-agent-init", int64p(5000), int64p(5001))),
			uid: 5000, gid: 5001,
			shared: []SharedProxyID{
				{Container: "vault-agent-init", Init: true, Kind: "uid", ID: 5000, Own: true},
				{Container: "vault-agent-init", Init: true, Kind: "gid", ID: 5001, Own: true},
			}},
		{name: "a container inheriting the pod's id that istio-proxy sets as its own is warned of",
			pod: injectedPod(withProxySecurity(int64p(2000), nil), withPodSecurity(int64p(2000), nil)), uid: 2000, gid: 1337,
			shared: []SharedProxyID{{Container: "app", Kind: "uid", ID: 2000}}},
		{name: "an app container's gid alone is warned of",
			pod: injectedPod(withContainerSecurity("app", int64p(1000), int64p(1337))), uid: 1337, gid: 1337,
			shared: []SharedProxyID{{Container: "app", Kind: "gid", ID: 1337, Own: true}}},
		{name: "an app container's out-of-range uid is not the proxy's",
			pod: injectedPod(withContainerSecurity("app", int64p(1<<32+1337), nil)), uid: 1337, gid: 1337},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, _, _ := tc.pod.Container(ContainerIstioProxy)
			uid, gid, shared, err := ProxyIdentity(tc.pod, proxy)
			if len(tc.errs) > 0 {
				if err == nil {
					t.Fatalf("no error (uid %d, gid %d, shared %+v), want one with %q", uid, gid, shared, tc.errs)
				}
				for _, w := range tc.errs {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if uid != tc.uid || gid != tc.gid {
				t.Errorf("uid, gid = %d, %d, want %d, %d", uid, gid, tc.uid, tc.gid)
			}
			if diff := cmp.Diff(tc.shared, shared); diff != "" {
				t.Errorf("shared (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanForCarriesSharedProxyID: the plan of a pod whose other container runs
// as the proxy's uid carries the warning, in the words the ADD's log and the
// doctor use, and the refusal is the plan's error, naming the pod.
func TestPlanForCarriesSharedProxyID(t *testing.T) {
	pod := injectedPod(withContainerSecurity("app", int64p(1337), nil))
	pp, err := PlanFor(webArgs, testConfig(), pod, nil, Sandbox{Addrs: addrs("10.0.0.5")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{SharedProxyIDWarning + " (container app, uid 1337, from container)"}
	if diff := cmp.Diff(want, pp.Warnings()); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	pod = injectedPod(withPodSecurity(int64p(2000), nil))
	pp, err = PlanFor(webArgs, testConfig(), pod, nil, Sandbox{Addrs: addrs("10.0.0.5")})
	if err == nil || !strings.HasPrefix(err.Error(), "pod default/web-1: istio-proxy sets no securityContext.runAsUser") {
		t.Fatalf("error %v, want the refusal naming the pod", err)
	}
	if pp.Plan != nil || pp.Decision.Verdict != Redirect {
		t.Errorf("plan %v, decision %v: want no plan and the redirect decision", pp.Plan, pp.Decision)
	}
}
