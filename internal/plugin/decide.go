package plugin

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Names and keys Istio's selection looks at.
const (
	ContainerIstioInit  = "istio-init"
	ContainerIstioProxy = "istio-proxy"
	// ContainerIstioValidation is the injector's init container that checks the
	// capture; it runs as the proxy's uid and gid by design.
	ContainerIstioValidation = "istio-validation"
	// NodeAgentPodPrefix starts the names of the istio-cni-node DaemonSet's pods.
	NodeAgentPodPrefix = "istio-cni-node-"

	KeyInject        = "sidecar.istio.io/inject" // a label (preferred) or an annotation
	KeySidecarStatus = "sidecar.istio.io/status"
	EnvDisableEnvoy  = "DISABLE_ENVOY"
	proxyTypeSidecar = "sidecar"
)

// PodArgs are the Kubernetes keys of CNI_ARGS, set by the runtime for a pod sandbox.
type PodArgs struct {
	Name             string // K8S_POD_NAME
	Namespace        string // K8S_POD_NAMESPACE
	UID              string // K8S_POD_UID
	InfraContainerID string // K8S_POD_INFRA_CONTAINER_ID
}

// ParsePodArgs parses CNI_ARGS ("K=V;K=V"). Keys other than the Kubernetes ones are
// ignored whether or not IgnoreUnknown is given: runtimes add their own, and none of
// them changes what the plugin does.
func ParsePodArgs(cniArgs string) (PodArgs, error) {
	var a PodArgs
	for _, pair := range strings.Split(cniArgs, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return PodArgs{}, fmt.Errorf("CNI_ARGS: %s is not KEY=VALUE", redirect.Quote(pair))
		}
		switch k {
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_UID":
			a.UID = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraContainerID = v
		}
	}
	return a, nil
}

// Key is "namespace/name".
func (a PodArgs) Key() string { return a.Namespace + "/" + a.Name }

// Verdict is what the plugin does with a pod.
type Verdict uint8

const (
	// Lookup: the arguments and config alone do not decide; fetch the pod.
	Lookup Verdict = iota
	// Skip: leave the pod's network alone and pass the previous result through.
	Skip
	// Redirect: program the sidecar capture.
	Redirect
)

func (v Verdict) String() string {
	switch v {
	case Skip:
		return "skip"
	case Redirect:
		return "redirect"
	}
	return "lookup"
}

// MarshalText makes verdicts readable in JSON.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// Rule names the selection rule that decided, stable for tests and tooling.
type Rule string

const (
	RuleNotKubernetes     Rule = "not-kubernetes"
	RuleNamespaceExcluded Rule = "namespace-excluded"
	RuleNodeAgent         Rule = "node-agent"
	RuleNeedPod           Rule = "need-pod"
	// RuleNeedNamespace: the pod alone does not decide (no sidecar, and its own
	// istio.io/dataplane-mode label does not say); its namespace's label does.
	RuleNeedNamespace   Rule = "need-namespace"
	RuleIstioInit       Rule = "istio-init"
	RuleEnvoyDisabled   Rule = "envoy-disabled"
	RuleNoIstioProxy    Rule = "no-istio-proxy"
	RuleNotSidecar      Rule = "not-sidecar"
	RuleInjectDisabled  Rule = "inject-disabled"
	RuleNoSidecarStatus Rule = "no-sidecar-status"
	RuleSidecar         Rule = "sidecar"
	// RuleAmbient: the pod asks for ambient capture (by its own label or its
	// namespace's), which this plugin does not have; PlanFor refuses it rather than
	// let it start uncaptured.
	RuleAmbient Rule = "ambient"
)

// Ambient mode's label, on a pod or its namespace, and its values: ambient puts the
// pods in ambient mode; none on a pod keeps it out whatever its namespace says.
const (
	LabelDataplaneMode = "istio.io/dataplane-mode"
	DataplaneAmbient   = "ambient"
	DataplaneNone      = "none"
)

// Decision is the verdict, the rule that gave it and a sentence for people (logs,
// explain), e.g. "skip: namespace kube-system is excluded".
type Decision struct {
	Verdict Verdict `json:"verdict"`
	Rule    Rule    `json:"rule"`
	Reason  string  `json:"reason"`
}

func decision(v Verdict, r Rule, format string, args ...any) Decision {
	return Decision{Verdict: v, Rule: r, Reason: v.String() + ": " + fmt.Sprintf(format, args...)}
}

// decideBeforeLookup applies the rules that need no API call: a sandbox that is not a
// Kubernetes pod, an excluded namespace, and the node agent's own pods. Istio checks
// the last one before the lookup only in ambient mode and otherwise only once the
// lookup has failed (its replacement agent pod must not wait on an API it cannot
// reach); checking it first always gives the same verdict, since agent pods carry no
// sidecar, and saves the call.
func decideBeforeLookup(args PodArgs, cfg *Config) Decision {
	if args.Name == "" || args.Namespace == "" {
		return Decision{Verdict: Skip, Rule: RuleNotKubernetes,
			Reason: "skip: not a Kubernetes pod (no K8S_POD_NAME and K8S_POD_NAMESPACE in CNI_ARGS), passing through"}
	}
	if slices.Contains(cfg.ExcludeNamespaces, args.Namespace) {
		return decision(Skip, RuleNamespaceExcluded, "namespace %s is excluded", args.Namespace)
	}
	if IsNodeAgentPod(args, cfg) {
		return decision(Skip, RuleNodeAgent, "pod %s is the istio-cni node agent", args.Key())
	}
	return decision(Lookup, RuleNeedPod, "pod %s needs a lookup", args.Key())
}

// IsNodeAgentPod recognises the istio-cni-node agent's pods from the CNI arguments
// alone, as Istio does: the name starts with "istio-cni-node-" and the namespace is
// the agent's (pod_namespace).
func IsNodeAgentPod(args PodArgs, cfg *Config) bool {
	return cfg.PodNamespace != "" && args.Namespace == cfg.PodNamespace &&
		strings.HasPrefix(args.Name, NodeAgentPodPrefix)
}

// decideWithPod applies the rules that read the pod, in Istio's order, and its
// namespace's labels when they decide. It assumes decideBeforeLookup returned
// Lookup. ns is nil when the caller has not looked the namespace up: the decision
// is then Lookup (RuleNeedNamespace) for a pod whose namespace decides.
func decideWithPod(pod *kube.Pod, ns *kube.Namespace) Decision {
	key := pod.Key()
	if _, _, ok := pod.Container(ContainerIstioInit); ok {
		return decision(Skip, RuleIstioInit, "pod %s has an istio-init container, which sets up the capture itself", key)
	}
	proxy, native, hasProxy := pod.Container(ContainerIstioProxy)
	if !hasProxy {
		if d, decided := decideAmbient(pod, ns); decided {
			return d
		}
	}
	// Istio reads DISABLE_ENVOY before checking the proxy exists; without a proxy
	// there is no environment to read, so the order only matters for the message.
	if v, ok := proxy.Getenv(EnvDisableEnvoy); hasProxy && ok {
		if off, err := strconv.ParseBool(v); err == nil && off {
			return decision(Skip, RuleEnvoyDisabled, "pod %s has %s=%s on istio-proxy", key, EnvDisableEnvoy, v)
		}
	}
	if !hasProxy {
		return decision(Skip, RuleNoIstioProxy, "pod %s has no istio-proxy container (has %s)", key, containerNames(pod))
	}
	if t := ProxyType(proxy); t != "" && t != proxyTypeSidecar {
		return decision(Skip, RuleNotSidecar, "pod %s runs istio-proxy as %q, not as a sidecar", key, t)
	}
	if v, from := injectSetting(pod); v != "" {
		// Unparseable values are ignored, as in Istio: only an explicit false opts out.
		if on, err := strconv.ParseBool(v); err == nil && !on {
			return decision(Skip, RuleInjectDisabled, "pod %s has %s %s=%q", key, from, KeyInject, v)
		}
	}
	if _, ok := pod.Metadata.Annotations[KeySidecarStatus]; !ok {
		return decision(Skip, RuleNoSidecarStatus, "pod %s has no %s annotation (not injected)", key, KeySidecarStatus)
	}
	kind := "container"
	if native {
		kind = "native sidecar (init container)"
	}
	return decision(Redirect, RuleSidecar, "pod %s has an injected istio-proxy %s", key, kind)
}

// decideAmbient says whether a pod without a sidecar is an ambient pod, as Istio's
// ambient mode selects them: its own istio.io/dataplane-mode label when that is
// ambient or none, else its namespace's label. A pod with a sidecar is left to the
// sidecar (Istio keeps it out of ambient) and never comes here. Any pod that ambient
// would capture gets no capture at all from this plugin, so it is refused.
// decided is false when ambient does not apply and the other rules go on.
func decideAmbient(pod *kube.Pod, ns *kube.Namespace) (d Decision, decided bool) {
	key := pod.Key()
	if _, injected := pod.Metadata.Annotations[KeySidecarStatus]; injected {
		// Istio's ambient selection leaves out every injected pod, whatever its
		// containers: a proxyless gRPC pod has the status annotation and no
		// istio-proxy, and neither of Istio's modes captures it.
		return Decision{}, false
	}
	switch pod.Metadata.Labels[LabelDataplaneMode] {
	case DataplaneAmbient:
		return decision(Skip, RuleAmbient, "pod %s has label %s=%s, but this istio-cni has no ambient mode", key, LabelDataplaneMode, DataplaneAmbient), true
	case DataplaneNone:
		// The pod opts out of ambient: its namespace's label does not apply.
		return Decision{}, false
	}
	if ns == nil {
		return decision(Lookup, RuleNeedNamespace, "pod %s has no sidecar: the %s label of its namespace %s decides whether it is an ambient pod",
			key, LabelDataplaneMode, pod.Metadata.Namespace), true
	}
	if ns.Metadata.Labels[LabelDataplaneMode] == DataplaneAmbient {
		return decision(Skip, RuleAmbient, "pod %s is in namespace %s, which has label %s=%s, but this istio-cni has no ambient mode",
			key, pod.Metadata.Namespace, LabelDataplaneMode, DataplaneAmbient), true
	}
	return Decision{}, false
}

// ProxyType is the proxy's role from its arguments ("proxy sidecar", "proxy router"),
// empty when the arguments do not say.
func ProxyType(proxy kube.Container) string {
	if len(proxy.Args) >= 2 && proxy.Args[0] == "proxy" {
		return proxy.Args[1]
	}
	return ""
}

// injectSetting returns sidecar.istio.io/inject and where it came from: the label
// when present (even empty), else the annotation.
func injectSetting(pod *kube.Pod) (value, from string) {
	if v, ok := pod.Metadata.Labels[KeyInject]; ok {
		return v, "label"
	}
	return pod.Metadata.Annotations[KeyInject], "annotation"
}

func containerNames(pod *kube.Pod) string {
	var names []string
	for _, c := range pod.AllContainers() {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// MatchesPod reports whether the looked-up pod is the sandbox's pod: a pod deleted
// and recreated under the same name (a StatefulSet's) has a new uid. A static pod's
// mirror has a uid of its own and the static pod's in an annotation
// (kube.HasSandboxUID). Runtimes that do not pass K8S_POD_UID match any pod.
func (a PodArgs) MatchesPod(pod *kube.Pod) error {
	if pod.Metadata.Namespace != a.Namespace || pod.Metadata.Name != a.Name {
		return fmt.Errorf("%w: looked up pod %s for sandbox of %s", ErrOtherPod, pod.Key(), a.Key())
	}
	if a.UID != "" && pod.Metadata.UID != "" && !kube.HasSandboxUID(pod.Metadata.UID, pod.Metadata.Annotations, a.UID) {
		return fmt.Errorf("%w: pod %s has uid %s, the sandbox is for uid %s (pod recreated?)", ErrOtherPod, a.Key(), pod.Metadata.UID, a.UID)
	}
	return nil
}

// ErrOtherPod is a looked-up pod that is not the sandbox's.
var ErrOtherPod = errors.New("not the sandbox's pod")
