package doctor

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Explanation is the plugin's decision for a pod and, when it redirects, the capture
// and the exact rules it programs.
type Explanation struct {
	Pod      string          `json:"pod"`
	Decision plugin.Decision `json:"decision"`
	// Capture summarises the spec in words; Rules are the backend's rules per family.
	Capture []string `json:"capture,omitempty"`
	// Warnings are what the plugin's ADD warns of for the pod, word for word
	// (plugin.PodPlan.Warnings): each variable of the sidecar's environment that
	// shapes the capture and holds no boolean, which the capture takes as false, and
	// each other container that runs as the proxy's uid or gid, whose traffic
	// bypasses the proxy.
	Warnings []string          `json:"warnings,omitempty"`
	Backend  string            `json:"backend,omitempty"`
	Rules    map[string]string `json:"rules,omitempty"`
	// Error is set when the pod would fail its ADD (for example a bad annotation).
	Error string `json:"error,omitempty"`
}

// DecodePod reads a pod manifest in YAML or JSON, as `kubectl get pod -o yaml` prints it.
func DecodePod(data []byte) (*kube.Pod, error) {
	js, err := manifestJSON(data, "Pod")
	if err != nil {
		return nil, err
	}
	return kube.DecodePod(js)
}

// DecodeNamespace reads a namespace manifest in YAML or JSON, as `kubectl get
// namespace -o yaml` prints it.
func DecodeNamespace(data []byte) (*kube.Namespace, error) {
	js, err := manifestJSON(data, "Namespace")
	if err != nil {
		return nil, err
	}
	var ns kube.Namespace
	if err := json.Unmarshal(js, &ns); err != nil {
		return nil, fmt.Errorf("decode namespace: %w", err)
	}
	if ns.Metadata.Name == "" {
		return nil, fmt.Errorf("decode namespace: metadata.name is required")
	}
	return &ns, nil
}

// manifestJSON converts a manifest in YAML or JSON to JSON, refusing one of
// another kind than want (a manifest that names no kind is taken as one).
func manifestJSON(data []byte, want string) ([]byte, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s manifest is not YAML or JSON: %w", strings.ToLower(want), err)
	}
	var kind struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(js, &kind); err == nil && kind.Kind != "" && kind.Kind != want {
		return nil, fmt.Errorf("manifest is a %s, not a %s", kind.Kind, want)
	}
	return js, nil
}

// Explain runs the plugin's pod-to-rules path (plugin.PlanFor) for pod under cfg and,
// for a pod it redirects, renders the rules for the backend ("iptables" or
// "nftables"). ns is the pod's namespace, nil when not given: a pod whose
// namespace decides is then explained as such (rule need-namespace). podIPs stand
// in for the sandbox's addresses (nil: the pod's status addresses).
func Explain(pod *kube.Pod, ns *kube.Namespace, cfg *plugin.Config, backend string, podIPs []netip.Addr) Explanation {
	pp, err := plugin.PlanFor(plugin.ArgsFor(pod), cfg, pod, ns, plugin.Sandbox{Addrs: podIPs})
	return explanation(pod, pp, err, backend)
}

// explanation puts the outcome of plugin.PlanFor into words and rules.
func explanation(pod *kube.Pod, pp plugin.PodPlan, err error, backend string) Explanation {
	ex := Explanation{Pod: pod.Key(), Decision: pp.Decision}
	if err != nil {
		ex.Error = err.Error()
		return ex
	}
	if pp.Plan == nil {
		return ex
	}
	ex.Capture = Describe(*pp.Spec)
	ex.Warnings = pp.Warnings()
	ex.Backend = backend
	ex.Rules = map[string]string{}
	if backend == "nftables" {
		text, err := nftables.Render(pp.Plan)
		if err != nil {
			ex.Error = err.Error()
			return ex
		}
		ex.Rules["all"] = text
	} else {
		for _, fp := range pp.Plan.Families {
			ex.Rules[fp.Family.String()] = iptables.RenderPlanText(&fp)
		}
	}
	return ex
}

// Describe says in words what a spec captures.
func Describe(s redirect.Spec) []string {
	ports := func(ps []uint16) string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = strconv.Itoa(int(p))
		}
		return strings.Join(out, ",")
	}
	ids := func(ids []uint32) string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = strconv.FormatUint(uint64(id), 10)
		}
		return strings.Join(out, ",")
	}
	var lines []string
	switch {
	case s.InboundPorts.All && len(s.InboundPortsExclude) > 0:
		lines = append(lines, fmt.Sprintf("inbound: all TCP ports except %s -> %d (%s)", ports(s.InboundPortsExclude), s.InboundCapturePort, s.Mode))
	case s.InboundPorts.All:
		lines = append(lines, fmt.Sprintf("inbound: all TCP ports -> %d (%s)", s.InboundCapturePort, s.Mode))
	case len(s.InboundPorts.Ports) > 0:
		lines = append(lines, fmt.Sprintf("inbound: TCP ports %s -> %d (%s)", ports(s.InboundPorts.Ports), s.InboundCapturePort, s.Mode))
	default:
		lines = append(lines, "inbound: not captured")
	}
	var out []string
	switch {
	case s.OutboundCIDRs.All:
		out = append(out, "all destinations")
	case len(s.OutboundCIDRs.Prefixes) > 0:
		var ps []string
		for _, p := range s.OutboundCIDRs.Prefixes {
			ps = append(ps, p.String())
		}
		out = append(out, "destinations "+strings.Join(ps, ","))
	}
	if len(s.OutboundPorts) > 0 {
		out = append(out, "TCP ports "+ports(s.OutboundPorts))
	}
	if len(out) == 0 {
		lines = append(lines, "outbound: not captured")
	} else {
		line := fmt.Sprintf("outbound: %s -> %d", strings.Join(out, " and "), s.ProxyPort)
		var except []string
		for _, p := range s.OutboundCIDRsExclude {
			except = append(except, p.String())
		}
		if len(s.OutboundPortsExclude) > 0 {
			except = append(except, "ports "+ports(s.OutboundPortsExclude))
		}
		if len(except) > 0 {
			line += ", except " + strings.Join(except, ", ")
		}
		lines = append(lines, line)
	}
	lines = append(lines, fmt.Sprintf("not captured: traffic of uid %s and gid %s (the proxy), and the tunnel port %d", ids(s.ProxyUIDs), ids(s.ProxyGIDs), s.InboundTunnelPort))
	if len(s.ExcludeInterfaces) > 0 {
		lines = append(lines, "interfaces never captured: "+strings.Join(s.ExcludeInterfaces, ","))
	}
	if len(s.RerouteVirtualInterfaces) > 0 {
		lines = append(lines, "virtual interfaces rerouted to the outbound listener: "+strings.Join(s.RerouteVirtualInterfaces, ","))
	}
	if s.DNS.Enabled {
		lines = append(lines, fmt.Sprintf("DNS: captured to %d (all DNS: %v)", s.DNSPort, s.DNS.CaptureAll))
	}
	if !s.OwnerGroups.Except && len(s.OwnerGroups.Groups) == 0 {
		lines = append(lines, "outbound of no group captured (an empty include list)")
	}
	if len(s.OwnerGroups.Groups) > 0 {
		groups := append([]string(nil), s.OwnerGroups.Groups...)
		sort.Strings(groups)
		if s.OwnerGroups.Except {
			lines = append(lines, "outbound of groups "+strings.Join(groups, ",")+" not captured")
		} else {
			lines = append(lines, "outbound captured only for groups "+strings.Join(groups, ","))
		}
	}
	if s.DropInvalid {
		lines = append(lines, "packets conntrack finds invalid are dropped")
	}
	if s.IPv6 {
		lines = append(lines, "IPv6: captured too")
	} else {
		lines = append(lines, "IPv6: not captured")
	}
	return lines
}

// decisionLine is the "Decision:" line of explain and inspect, one wording for
// both: an ADD that fails, as a redirect or as a refusal (an ambient pod, a rule
// that fails closed), or the verdict and its reason. It reports whether the pod's
// capture follows (a redirect that the ADD carries out).
func decisionLine(b *strings.Builder, d plugin.Decision, addErr string) (captured bool) {
	indented := strings.ReplaceAll(addErr, "\n", "\n  ")
	switch {
	case addErr != "" && d.Verdict == plugin.Redirect:
		fmt.Fprintf(b, "Decision: redirect, but the plugin's ADD FAILS (the pod stays in ContainerCreating):\n  %s\n", indented)
	case addErr != "":
		fmt.Fprintf(b, "Decision: REFUSED (rule %s): the plugin's ADD FAILS (the pod stays in ContainerCreating):\n  %s\n", d.Rule, indented)
	case d.Rule == plugin.RuleNeedNamespace:
		fmt.Fprintf(b, "Decision: depends on the pod's namespace (rule %s): %s\n"+
			"  Give the namespace to decide: -namespace NS.yaml (kubectl get namespace NS -o yaml)\n", d.Rule, d.Reason)
	case d.Verdict == plugin.Redirect:
		fmt.Fprintf(b, "Decision: traffic is redirected to the sidecar (%s)\n", d.Reason)
		return true
	default:
		fmt.Fprintf(b, "Decision: NOT redirected (rule %s): %s\n", d.Rule, d.Reason)
	}
	return false
}

// captureLines are the lines under the "Decision:" line of a redirected pod, in
// explain and inspect, one wording for both: the capture in words, then each
// warning the plugin's ADD logs for the pod.
func captureLines(b *strings.Builder, capture, warnings []string) {
	for _, l := range capture {
		fmt.Fprintf(b, "  %s\n", l)
	}
	for _, w := range warnings {
		fmt.Fprintf(b, "  WARNING: %s\n", w)
	}
}

// Text renders an explanation for people.
func (ex Explanation) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Pod %s\n", ex.Pod)
	if !decisionLine(&b, ex.Decision, ex.Error) {
		return b.String()
	}
	captureLines(&b, ex.Capture, ex.Warnings)
	keys := make([]string, 0, len(ex.Rules))
	for k := range ex.Rules {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\nRules the plugin programs (%s, %s):\n%s", ex.Backend, k, ex.Rules[k])
	}
	return b.String()
}
