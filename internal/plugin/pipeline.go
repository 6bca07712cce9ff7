package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// PodPlan is what the plugin does with one pod: the decision and, for a pod it
// redirects, the validated capture spec and the rules built from it.
type PodPlan struct {
	Decision Decision
	// Spec and Plan are set only when Decision.Verdict is Redirect and the capture
	// could be built.
	Spec *redirect.Spec
	Plan *redirect.Plan
	// EnvNotBool are the sidecar's variables that shape the capture and hold no
	// boolean (set with Spec): each counted as false, as the proxy counts it, and
	// ADD warns of each.
	EnvNotBool []EnvNotBool
	// SharedProxyID are the other containers that run as the proxy's uid or gid
	// (set with Spec): the capture exempts their traffic as the proxy's, and ADD
	// warns of each (see ProxyIdentity).
	SharedProxyID []SharedProxyID
}

// Warnings are what ADD warns of for the pod, one line each, as its log has them:
// what the doctor's explain and inspect print.
func (pp PodPlan) Warnings() []string {
	var out []string
	for _, e := range pp.EnvNotBool {
		out = append(out, e.Warning())
	}
	for _, s := range pp.SharedProxyID {
		out = append(out, s.Warning())
	}
	return out
}

// PlanFor is the one path from a pod to its rules: selection, pod to spec, spec to
// plan. ADD, CHECK, repair in place and the doctor's explain, inspect and probe all
// call it, so none of them can disagree with another about a pod.
//
// pod may be nil when the caller has not looked it up: the plan then holds only a
// decision that needs no lookup (Skip), or Lookup (RuleNeedPod). ns is the pod's
// Kubernetes namespace, nil when the caller has not looked it up: it is needed only
// for a pod without a sidecar whose own istio.io/dataplane-mode label does not
// decide, and then the plan holds Lookup (RuleNeedNamespace); the caller looks the
// namespace up and calls again. sb says what is known of the pod's network
// namespace; its addresses decide IPv6 capture (see Sandbox).
//
// An error means the pod needs redirection and its capture cannot be built (a bad
// annotation, for example); it names the pod, the annotation and the value, and the
// returned plan still carries the decision.
func PlanFor(args PodArgs, cfg *Config, pod *kube.Pod, ns *kube.Namespace, sb Sandbox) (PodPlan, error) {
	d := decideBeforeLookup(args, cfg)
	if d.Verdict != Lookup || pod == nil {
		return PodPlan{Decision: d}, nil
	}
	pp := PodPlan{Decision: decideWithPod(pod, ns)}
	if pp.Decision.Rule == RuleAmbient {
		// It needs capture that this plugin cannot give: fail closed.
		fix := "remove the label"
		if pod.Metadata.Labels[LabelDataplaneMode] != DataplaneAmbient {
			fix = fmt.Sprintf("label the pod %s=%s to keep it out of ambient", LabelDataplaneMode, DataplaneNone)
		}
		// The reason without its verdict's "skip: ": the pod is refused, not skipped.
		reason := strings.TrimPrefix(pp.Decision.Reason, pp.Decision.Verdict.String()+": ")
		return pp, fmt.Errorf("%s: refusing to start it without traffic capture (install Istio's ambient istio-cni for ambient pods, or %s)", reason, fix)
	}
	if pp.Decision.Verdict != Redirect {
		return pp, nil
	}
	addrs := sb.Addrs
	if len(addrs) == 0 && sb.Netns != "" {
		// Standalone (no previous result): during a pod's first ADD its status has no
		// addresses yet, so the families to capture come from what the namespace holds.
		var err error
		if addrs, err = netns.Addrs(sb.Netns); err != nil {
			return pp, fmt.Errorf("pod %s: %w: %w", pod.Key(), ErrNetnsUnreadable, err)
		}
	}
	spec, warn, err := specFromPod(pod, cfg, addrs)
	if err != nil {
		return pp, err
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		return pp, fmt.Errorf("pod %s: %w", pod.Key(), err)
	}
	pp.Spec, pp.Plan, pp.EnvNotBool, pp.SharedProxyID = &spec, plan, warn.notBool, warn.shared
	return pp, nil
}

// ErrNetnsUnreadable is a PlanFor error that is the node's, not the pod's: the
// addresses of the pod's network namespace could not be read.
var ErrNetnsUnreadable = errors.New("cannot read the addresses of its network namespace")

// Sandbox is what is known of a pod's network namespace when its rules are planned.
type Sandbox struct {
	// Addrs are the namespace's addresses when the caller knows them: the previous
	// plugin's result in a chain, or addresses given to the doctor.
	Addrs []netip.Addr
	// Netns is the namespace's path. When Addrs is empty PlanFor reads the addresses
	// from it, for a pod it redirects. When both are empty, the pod's status
	// addresses stand in.
	Netns string
}

// ArgsFor are the CNI arguments a runtime passes for pod's sandbox, for the paths
// that start from a pod rather than from a CNI call (repair, the doctor).
func ArgsFor(pod *kube.Pod) PodArgs {
	return PodArgs{Name: pod.Metadata.Name, Namespace: pod.Metadata.Namespace, UID: pod.Metadata.UID}
}
