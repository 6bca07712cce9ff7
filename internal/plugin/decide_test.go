package plugin

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// injectedPod is a pod as Istio's injector leaves it for the CNI plugin: an app
// container, an istio-proxy sidecar running "proxy sidecar", and the status
// annotation. Each case changes it.
func injectedPod(mods ...func(p *kube.Pod)) *kube.Pod {
	p := &kube.Pod{
		Metadata: kube.ObjectMeta{
			Name: "web-1", Namespace: "default", UID: "uid-1",
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{KeySidecarStatus: `{"containers":["istio-proxy"]}`},
		},
		Spec: kube.PodSpec{
			InitContainers: []kube.Container{{Name: "istio-validation"}},
			Containers: []kube.Container{
				{Name: "app"},
				{Name: ContainerIstioProxy, Args: []string{"proxy", "sidecar", "--domain", "default.svc.cluster.local"}},
			},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func proxyOf(p *kube.Pod) *kube.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == ContainerIstioProxy {
			return &p.Spec.Containers[i]
		}
	}
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == ContainerIstioProxy {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func withProxyEnv(name, value string) func(p *kube.Pod) {
	return func(p *kube.Pod) {
		c := proxyOf(p)
		c.Env = append(c.Env, kube.EnvVar{Name: name, Value: value})
	}
}

func withAnnotation(k, v string) func(p *kube.Pod) {
	return func(p *kube.Pod) { p.Metadata.Annotations[k] = v }
}

func withLabel(k, v string) func(p *kube.Pod) {
	return func(p *kube.Pod) { p.Metadata.Labels[k] = v }
}

func withoutAnnotation(k string) func(p *kube.Pod) {
	return func(p *kube.Pod) { delete(p.Metadata.Annotations, k) }
}

// nativeSidecar moves istio-proxy into the init containers with restartPolicy Always.
func nativeSidecar(p *kube.Pod) {
	proxy := *proxyOf(p)
	proxy.RestartPolicy = kube.RestartPolicyAlways
	p.Spec.Containers = p.Spec.Containers[:1]
	p.Spec.InitContainers = append(p.Spec.InitContainers, proxy)
}

// testConfig is the defaults with the system namespaces excluded, changed by each
// non-nil mod.
func testConfig(mods ...func(*Config)) *Config {
	c := defaults()
	c.ExcludeNamespaces = []string{"kube-system", "istio-system"}
	c.PodNamespace = "istio-cni"
	for _, mod := range mods {
		if mod != nil {
			mod(&c)
		}
	}
	return &c
}

var webArgs = PodArgs{Name: "web-1", Namespace: "default", UID: "uid-1"}

func TestDecideBeforeLookup(t *testing.T) {
	for _, tc := range []struct {
		name string
		args PodArgs
		cfg  func(c *Config)
		want Decision
	}{
		{"no pod name: not a Kubernetes pod, pass through", PodArgs{Namespace: "default"}, nil,
			Decision{Skip, RuleNotKubernetes, "skip: not a Kubernetes pod (no K8S_POD_NAME and K8S_POD_NAMESPACE in CNI_ARGS), passing through"}},
		{"no namespace: not a Kubernetes pod", PodArgs{Name: "web-1"}, nil,
			Decision{Skip, RuleNotKubernetes, "skip: not a Kubernetes pod (no K8S_POD_NAME and K8S_POD_NAMESPACE in CNI_ARGS), passing through"}},
		{"excluded namespace skips", PodArgs{Name: "coredns-1", Namespace: "kube-system"}, nil,
			Decision{Skip, RuleNamespaceExcluded, "skip: namespace kube-system is excluded"}},
		{"node agent pod skips before the lookup", PodArgs{Name: "istio-cni-node-x7k2p", Namespace: "istio-cni"}, nil,
			Decision{Skip, RuleNodeAgent, "skip: pod istio-cni/istio-cni-node-x7k2p is the istio-cni node agent"}},
		{"agent-like name in another namespace needs the pod", PodArgs{Name: "istio-cni-node-x7k2p", Namespace: "default"}, nil,
			Decision{Lookup, RuleNeedPod, "lookup: pod default/istio-cni-node-x7k2p needs a lookup"}},
		{"agent namespace unset: no pod is the agent", PodArgs{Name: "istio-cni-node-x7k2p", Namespace: "istio-cni"},
			func(c *Config) { c.PodNamespace = "" },
			Decision{Lookup, RuleNeedPod, "lookup: pod istio-cni/istio-cni-node-x7k2p needs a lookup"}},
		{"other pod in the agent namespace needs the pod", PodArgs{Name: "istio-cni-repair", Namespace: "istio-cni"}, nil,
			Decision{Lookup, RuleNeedPod, "lookup: pod istio-cni/istio-cni-repair needs a lookup"}},
		{"ordinary pod needs the pod", webArgs, nil,
			Decision{Lookup, RuleNeedPod, "lookup: pod default/web-1 needs a lookup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.cfg)
			if diff := cmp.Diff(tc.want, decideBeforeLookup(tc.args, cfg)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			// PlanFor without a pod stops at the same place.
			pp, err := PlanFor(tc.args, cfg, nil, nil, Sandbox{})
			if err != nil || pp.Plan != nil {
				t.Errorf("PlanFor(nil pod) = plan %v, error %v; want only a decision", pp.Plan, err)
			}
			if diff := cmp.Diff(tc.want, pp.Decision); diff != "" {
				t.Errorf("PlanFor(nil pod) (-want +got):\n%s", diff)
			}
		})
	}
}

// namespace is the pod's namespace as looked up, with labels.
func namespace(labels map[string]string) *kube.Namespace {
	return &kube.Namespace{Metadata: kube.ObjectMeta{Name: "default", Labels: labels}}
}

// plainNamespace is a namespace without Istio's labels; ambientNamespace is labelled
// istio.io/dataplane-mode=ambient.
var (
	plainNamespace   = namespace(map[string]string{"kubernetes.io/metadata.name": "default"})
	ambientNamespace = namespace(map[string]string{LabelDataplaneMode: DataplaneAmbient})
)

func withoutProxy(p *kube.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }

// notInjected is a pod the injector has not touched: no istio-proxy and no status
// annotation (an injected pod without istio-proxy, a proxyless gRPC pod, is not an
// ambient pod).
func notInjected(p *kube.Pod) { withoutProxy(p); delete(p.Metadata.Annotations, KeySidecarStatus) }

func TestDecideWithPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *kube.Pod
		rule Rule
		want string
	}{
		{"injected sidecar redirects", injectedPod(), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"native sidecar in init containers redirects", injectedPod(nativeSidecar), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy native sidecar (init container)"},
		{"istio-init init container skips", injectedPod(func(p *kube.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, kube.Container{Name: ContainerIstioInit})
		}), RuleIstioInit, "skip: pod default/web-1 has an istio-init container, which sets up the capture itself"},
		{"istio-init as a regular container skips too", injectedPod(func(p *kube.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, kube.Container{Name: ContainerIstioInit})
		}), RuleIstioInit, "skip: pod default/web-1 has an istio-init container, which sets up the capture itself"},
		{"a pod with a sidecar stays a sidecar pod under the ambient label", injectedPod(withLabel(LabelDataplaneMode, DataplaneAmbient)), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"an ambient pod is recognised (and refused by PlanFor)", injectedPod(withLabel(LabelDataplaneMode, DataplaneAmbient), notInjected), RuleAmbient,
			"skip: pod default/web-1 has label istio.io/dataplane-mode=ambient, but this istio-cni has no ambient mode"},
		{"no istio-proxy skips", injectedPod(func(p *kube.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }), RuleNoIstioProxy,
			"skip: pod default/web-1 has no istio-proxy container (has app, istio-validation)"},
		{"no containers at all skips", injectedPod(func(p *kube.Pod) { p.Spec = kube.PodSpec{} }), RuleNoIstioProxy,
			"skip: pod default/web-1 has no istio-proxy container (has none)"},
		{"DISABLE_ENVOY=true skips", injectedPod(withProxyEnv(EnvDisableEnvoy, "true")), RuleEnvoyDisabled,
			"skip: pod default/web-1 has DISABLE_ENVOY=true on istio-proxy"},
		{"DISABLE_ENVOY=1 skips (strconv forms)", injectedPod(withProxyEnv(EnvDisableEnvoy, "1")), RuleEnvoyDisabled,
			"skip: pod default/web-1 has DISABLE_ENVOY=1 on istio-proxy"},
		{"DISABLE_ENVOY=false redirects", injectedPod(withProxyEnv(EnvDisableEnvoy, "false")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"DISABLE_ENVOY unparseable is ignored", injectedPod(withProxyEnv(EnvDisableEnvoy, "yes please")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"DISABLE_ENVOY on another container is ignored", injectedPod(func(p *kube.Pod) {
			p.Spec.Containers[0].Env = []kube.EnvVar{{Name: EnvDisableEnvoy, Value: "true"}}
		}), RuleSidecar, "redirect: pod default/web-1 has an injected istio-proxy container"},
		{"proxy router (gateway) skips", injectedPod(func(p *kube.Pod) { proxyOf(p).Args = []string{"proxy", "router"} }), RuleNotSidecar,
			`skip: pod default/web-1 runs istio-proxy as "router", not as a sidecar`},
		{"proxy waypoint skips", injectedPod(func(p *kube.Pod) { proxyOf(p).Args = []string{"proxy", "waypoint"} }), RuleNotSidecar,
			`skip: pod default/web-1 runs istio-proxy as "waypoint", not as a sidecar`},
		{"args not starting with proxy count as sidecar", injectedPod(func(p *kube.Pod) { proxyOf(p).Args = []string{"router"} }), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"no args count as sidecar", injectedPod(func(p *kube.Pod) { proxyOf(p).Args = nil }), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"inject annotation false skips", injectedPod(withAnnotation(KeyInject, "false")), RuleInjectDisabled,
			`skip: pod default/web-1 has annotation sidecar.istio.io/inject="false"`},
		{"inject label false skips", injectedPod(withLabel(KeyInject, "false")), RuleInjectDisabled,
			`skip: pod default/web-1 has label sidecar.istio.io/inject="false"`},
		{"inject label true wins over annotation false", injectedPod(withLabel(KeyInject, "true"), withAnnotation(KeyInject, "false")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"inject label false wins over annotation true", injectedPod(withLabel(KeyInject, "false"), withAnnotation(KeyInject, "true")), RuleInjectDisabled,
			`skip: pod default/web-1 has label sidecar.istio.io/inject="false"`},
		{"empty inject label hides the annotation", injectedPod(withLabel(KeyInject, ""), withAnnotation(KeyInject, "false")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"unparseable inject value is ignored", injectedPod(withAnnotation(KeyInject, "disabled")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"no sidecar status annotation skips", injectedPod(withoutAnnotation(KeySidecarStatus)), RuleNoSidecarStatus,
			"skip: pod default/web-1 has no sidecar.istio.io/status annotation (not injected)"},
		{"empty sidecar status still counts", injectedPod(withAnnotation(KeySidecarStatus, "")), RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy container"},
		{"nil maps: no status annotation", injectedPod(func(p *kube.Pod) { p.Metadata.Labels, p.Metadata.Annotations = nil, nil }), RuleNoSidecarStatus,
			"skip: pod default/web-1 has no sidecar.istio.io/status annotation (not injected)"},
		// Istio's order: istio-init beats everything, DISABLE_ENVOY beats proxy type.
		{"istio-init is checked before DISABLE_ENVOY", injectedPod(withProxyEnv(EnvDisableEnvoy, "true"), func(p *kube.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, kube.Container{Name: ContainerIstioInit})
		}), RuleIstioInit, "skip: pod default/web-1 has an istio-init container, which sets up the capture itself"},
		{"DISABLE_ENVOY is checked before the proxy type", injectedPod(withProxyEnv(EnvDisableEnvoy, "true"),
			func(p *kube.Pod) { proxyOf(p).Args = []string{"proxy", "router"} }), RuleEnvoyDisabled,
			"skip: pod default/web-1 has DISABLE_ENVOY=true on istio-proxy"},
		{"proxy type is checked before the inject setting", injectedPod(withLabel(KeyInject, "false"),
			func(p *kube.Pod) { proxyOf(p).Args = []string{"proxy", "router"} }), RuleNotSidecar,
			`skip: pod default/web-1 runs istio-proxy as "router", not as a sidecar`},
		{"inject setting is checked before the status annotation", injectedPod(withLabel(KeyInject, "false"), withoutAnnotation(KeySidecarStatus)),
			RuleInjectDisabled, `skip: pod default/web-1 has label sidecar.istio.io/inject="false"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp, _ := PlanFor(webArgs, testConfig(), tc.pod, plainNamespace, Sandbox{})
			got := pp.Decision
			wantVerdict := Skip
			if tc.rule == RuleSidecar {
				wantVerdict = Redirect
			}
			if diff := cmp.Diff(Decision{wantVerdict, tc.rule, tc.want}, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideNeverLooksAtThePodWhenArgsDecide(t *testing.T) {
	// A pod that would redirect does not override an excluded namespace.
	pp, _ := PlanFor(PodArgs{Name: "web-1", Namespace: "kube-system"}, testConfig(), injectedPod(), ambientNamespace, Sandbox{})
	if got := pp.Decision; got.Rule != RuleNamespaceExcluded || pp.Plan != nil {
		t.Errorf("rule = %s, want %s", got.Rule, RuleNamespaceExcluded)
	}
}

func TestParsePodArgs(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     PodArgs
		wantErr  string
	}{
		{"containerd's arguments", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			PodArgs{Name: "web-1", Namespace: "default", UID: "u-1", InfraContainerID: "abc"}, ""},
		{"empty", "", PodArgs{}, ""},
		{"unknown keys without IgnoreUnknown", "FOO=bar;K8S_POD_NAME=a", PodArgs{Name: "a"}, ""},
		{"value containing =", "K8S_POD_NAME=a=b", PodArgs{Name: "a=b"}, ""},
		{"trailing separator", "K8S_POD_NAME=a;", PodArgs{Name: "a"}, ""},
		{"pair without =", "K8S_POD_NAME", PodArgs{}, `CNI_ARGS: "K8S_POD_NAME" is not KEY=VALUE`},
		{"a long pair without = is quoted by its start", strings.Repeat("x", 100000), PodArgs{},
			`CNI_ARGS: "` + strings.Repeat("x", 48) + `"... (100000 bytes) is not KEY=VALUE`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePodArgs(tc.in)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMatchesPodCatchesARecreatedPod(t *testing.T) {
	pod := injectedPod()
	for _, tc := range []struct {
		name    string
		args    PodArgs
		wantErr string
	}{
		{"same uid", webArgs, ""},
		{"runtime passes no uid", PodArgs{Name: "web-1", Namespace: "default"}, ""},
		{"different uid", PodArgs{Name: "web-1", Namespace: "default", UID: "uid-0"}, "pod recreated"},
		{"different name", PodArgs{Name: "web-2", Namespace: "default"}, "looked up pod default/web-1 for sandbox of default/web-2"},
		// A static pod's mirror: its own uid is the API server's; the kubelet's,
		// which the runtime passes, is in the mirror annotation.
		{"mirror of the static pod", PodArgs{Name: "web-1", Namespace: "default", UID: "static-uid"}, ""},
		{"mirror of another static pod", PodArgs{Name: "web-1", Namespace: "default", UID: "static-uid-2"}, "pod recreated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := pod
			if strings.HasPrefix(tc.name, "mirror") {
				pod = injectedPod(func(p *kube.Pod) { p.Metadata.Annotations[kube.MirrorAnnotation] = "static-uid" })
			}
			err := tc.args.MatchesPod(pod)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("MatchesPod = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestPlanForRefusesAmbientPods: a pod asking for ambient capture fails its ADD
// (fail closed) instead of starting with no proxy in its path.
func TestPlanForRefusesAmbientPods(t *testing.T) {
	pod := injectedPod(withLabel(LabelDataplaneMode, DataplaneAmbient), notInjected)
	pp, err := PlanFor(webArgs, testConfig(), pod, nil, Sandbox{})
	if err == nil || !strings.Contains(err.Error(), "no ambient mode") || !strings.Contains(err.Error(), "default/web-1") {
		t.Fatalf("PlanFor(ambient pod) error = %v, want a refusal naming the pod", err)
	}
	if pp.Plan != nil || pp.Decision.Rule != RuleAmbient {
		t.Errorf("PlanFor(ambient pod) = %+v, want no plan and rule %s", pp, RuleAmbient)
	}
}

// TestDecideAmbientByPodAndNamespace: a pod without a sidecar is an ambient pod, and
// refused, when its own istio.io/dataplane-mode label says ambient, or when its
// namespace's does and its own does not say none; a sidecar pod is left to its
// sidecar. The namespace is asked for (Lookup, RuleNeedNamespace) only when it
// decides.
func TestDecideAmbientByPodAndNamespace(t *testing.T) {
	const (
		byPod       = "skip: pod default/web-1 has label istio.io/dataplane-mode=ambient, but this istio-cni has no ambient mode"
		byNamespace = "skip: pod default/web-1 is in namespace default, which has label istio.io/dataplane-mode=ambient, but this istio-cni has no ambient mode"
		noProxy     = "skip: pod default/web-1 has no istio-proxy container (has app, istio-validation)"
		needNS      = "lookup: pod default/web-1 has no sidecar: the istio.io/dataplane-mode label of its namespace default decides whether it is an ambient pod"
		sidecar     = "redirect: pod default/web-1 has an injected istio-proxy container"
	)
	for _, tc := range []struct {
		name    string
		pod     *kube.Pod
		ns      *kube.Namespace
		verdict Verdict
		rule    Rule
		want    string
	}{
		{"no sidecar, namespace not looked up: it is needed", injectedPod(notInjected), nil, Lookup, RuleNeedNamespace, needNS},
		{"no sidecar in an ambient namespace: refused", injectedPod(notInjected), ambientNamespace, Skip, RuleAmbient, byNamespace},
		{"no sidecar in a plain namespace: not meshed", injectedPod(notInjected), plainNamespace, Skip, RuleNoIstioProxy, noProxy},
		{"no sidecar in a namespace labelled none: not meshed", injectedPod(notInjected),
			namespace(map[string]string{LabelDataplaneMode: DataplaneNone}), Skip, RuleNoIstioProxy, noProxy},
		{"no sidecar in a namespace without labels: not meshed", injectedPod(notInjected), namespace(nil), Skip, RuleNoIstioProxy, noProxy},
		{"pod label none overrides the ambient namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, DataplaneNone)),
			ambientNamespace, Skip, RuleNoIstioProxy, noProxy},
		{"pod label none needs no namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, DataplaneNone)),
			nil, Skip, RuleNoIstioProxy, noProxy},
		{"pod label ambient needs no namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, DataplaneAmbient)),
			nil, Skip, RuleAmbient, byPod},
		{"pod label ambient overrides a plain namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, DataplaneAmbient)),
			plainNamespace, Skip, RuleAmbient, byPod},
		// Istio's values are ambient and none; any other value leaves it to the namespace.
		{"another pod label value leaves it to the namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, "sidecar")),
			ambientNamespace, Skip, RuleAmbient, byNamespace},
		{"another pod label value still needs the namespace", injectedPod(notInjected, withLabel(LabelDataplaneMode, "")),
			nil, Lookup, RuleNeedNamespace, needNS},
		{"namespace label value other than ambient: not meshed", injectedPod(notInjected),
			namespace(map[string]string{LabelDataplaneMode: "Ambient"}), Skip, RuleNoIstioProxy, noProxy},
		{"sidecar pod in an ambient namespace is left to its sidecar", injectedPod(), ambientNamespace, Redirect, RuleSidecar, sidecar},
		{"sidecar pod needs no namespace", injectedPod(), nil, Redirect, RuleSidecar, sidecar},
		{"native sidecar pod in an ambient namespace is left to its sidecar", injectedPod(nativeSidecar), ambientNamespace, Redirect, RuleSidecar,
			"redirect: pod default/web-1 has an injected istio-proxy native sidecar (init container)"},
		{"istio-init pod needs no namespace", injectedPod(notInjected, func(p *kube.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, kube.Container{Name: ContainerIstioInit})
		}), nil, Skip, RuleIstioInit, "skip: pod default/web-1 has an istio-init container, which sets up the capture itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp, err := PlanFor(webArgs, testConfig(), tc.pod, tc.ns, Sandbox{})
			if diff := cmp.Diff(Decision{tc.verdict, tc.rule, tc.want}, pp.Decision); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if refused := err != nil; refused != (tc.rule == RuleAmbient) {
				t.Errorf("PlanFor error = %v; want one exactly for an ambient pod", err)
			}
			if tc.verdict != Redirect && pp.Plan != nil {
				t.Errorf("PlanFor built a plan for a %s decision", tc.verdict)
			}
		})
	}
}

// TestPlanForRefusesPodsOfAnAmbientNamespace: the refusal names the pod, the
// namespace and its label, and says how to keep the pod out of ambient.
func TestPlanForRefusesPodsOfAnAmbientNamespace(t *testing.T) {
	_, err := PlanFor(webArgs, testConfig(), injectedPod(notInjected), ambientNamespace, Sandbox{})
	wanterr.Mentions(t, err, "pod default/web-1", "namespace default", "istio.io/dataplane-mode=ambient", "no ambient mode",
		"refusing to start it without traffic capture", "label the pod istio.io/dataplane-mode=none")
}

// TestAnInjectedPodWithoutIstioProxyIsNotAnAmbientPod: Istio's ambient selection
// leaves out every pod with the sidecar.istio.io/status annotation, whatever its
// containers, and Istio's plugin skips a pod without istio-proxy. A proxyless gRPC
// pod (the injector's grpc-simple template adds a bootstrap init container and the
// status annotation, no istio-proxy) is therefore skipped in an ambient namespace or
// under the ambient label, never refused, and its namespace is not needed.
func TestAnInjectedPodWithoutIstioProxyIsNotAnAmbientPod(t *testing.T) {
	proxyless := func(p *kube.Pod) {
		withoutProxy(p)
		p.Spec.InitContainers = []kube.Container{{Name: "grpc-bootstrap-init"}}
	}
	want := Decision{Skip, RuleNoIstioProxy, "skip: pod default/web-1 has no istio-proxy container (has app, grpc-bootstrap-init)"}
	for _, tc := range []struct {
		name string
		pod  *kube.Pod
		ns   *kube.Namespace
	}{
		{"in an ambient namespace", injectedPod(proxyless), ambientNamespace},
		{"namespace not looked up", injectedPod(proxyless), nil},
		{"labelled ambient", injectedPod(proxyless, withLabel(LabelDataplaneMode, DataplaneAmbient)), plainNamespace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp, err := PlanFor(webArgs, testConfig(), tc.pod, tc.ns, Sandbox{})
			if err != nil {
				t.Errorf("PlanFor refused the pod: %v", err)
			}
			if diff := cmp.Diff(want, pp.Decision); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}
