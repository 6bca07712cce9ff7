package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Pod annotations that shape the capture, Istio's names.
const (
	AnnotationInterceptionMode         = "sidecar.istio.io/interceptionMode"
	AnnotationIncludeOutboundIPRanges  = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutboundIPRanges  = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationIncludeInboundPorts      = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationExcludeInboundPorts      = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationIncludeOutboundPorts     = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeOutboundPorts     = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeInterfaces        = "traffic.sidecar.istio.io/excludeInterfaces"
	AnnotationKubevirtInterfaces       = "traffic.sidecar.istio.io/kubevirtInterfaces" // deprecated
	AnnotationRerouteVirtualInterfaces = "istio.io/reroute-virtual-interfaces"
)

// istio-proxy environment variables that shape the capture.
const (
	EnvDNSCapture  = "ISTIO_META_DNS_CAPTURE"
	EnvDualStack   = "ISTIO_DUAL_STACK"
	EnvInvalidDrop = "INVALID_DROP"
)

// Istio's CNI defaults for absent annotations. They differ from istio-iptables' own:
// the status port 15020 is excluded both ways unless the annotation says otherwise.
const (
	defaultInboundPorts         = "*"
	defaultOutboundIPRanges     = "*"
	defaultExcludeInboundPorts  = "15020"
	defaultExcludeOutboundPorts = "15020"
)

// alwaysExcludedInboundPorts are added to any excludeInboundPorts: the agent's status,
// health and Prometheus ports.
var alwaysExcludedInboundPorts = []uint16{15020, 15021, 15090}

// annotationFields are the traffic annotations in the order they are read, each with
// the capture field it sets, Istio's CNI default when it is absent ("" and absent
// leave the field as redirect.DefaultSpec has it) and the check Istio's plugin makes
// of a value the pod gives (see annotationsyntax.go; nil: Istio's plugin takes any).
// The virtual interfaces' annotations, read after these, get checkInterfaceList too.
var annotationFields = [...]struct {
	key   string
	field redirect.Field
	def   string
	istio func(string) error
}{
	{AnnotationInterceptionMode, redirect.FieldMode, "", checkInterceptionMode},
	{AnnotationIncludeOutboundIPRanges, redirect.FieldOutboundCIDRs, defaultOutboundIPRanges, checkCIDRList},
	{AnnotationExcludeOutboundIPRanges, redirect.FieldOutboundCIDRsExclude, "", checkCIDRList},
	{AnnotationIncludeInboundPorts, redirect.FieldInboundPorts, defaultInboundPorts, checkPortListUntrimmed},
	{AnnotationExcludeInboundPorts, redirect.FieldInboundPortsExclude, defaultExcludeInboundPorts, checkPortList},
	{AnnotationIncludeOutboundPorts, redirect.FieldOutboundPorts, "", checkPortListUntrimmed},
	{AnnotationExcludeOutboundPorts, redirect.FieldOutboundPortsExclude, defaultExcludeOutboundPorts, checkPortListUntrimmed},
	{AnnotationExcludeInterfaces, redirect.FieldExcludeInterfaces, "", checkInterfaceList},
}

// specFromPod builds the capture spec of a pod selected for redirection, as Istio's
// plugin does: the traffic annotations with Istio's CNI defaults, the istio-proxy
// container's environment and identity, and IPv6 from the sandbox's addresses (see
// PlanFor). The node's extra_bypass_uids are added to the proxy's uids. Each
// annotation is parsed once, straight into the spec; every error names the pod, the
// annotation and the value. warn are the proxy's variables that hold no boolean
// (see envBool) and the other containers that run as the proxy's uid or gid (see
// ProxyIdentity).
func specFromPod(pod *kube.Pod, cfg *Config, podIPs []netip.Addr) (spec redirect.Spec, warn podWarnings, err error) {
	ann := pod.Metadata.Annotations
	spec = redirect.DefaultSpec()
	var errs []error
	// The list items each annotation gave, for the limit of all: on the stack,
	// one per annotation read (the traffic annotations and the virtual interfaces').
	var gaveBuf [len(annotationFields) + 1]annotationItems
	gave := gaveBuf[:0]
	set := func(key string, f redirect.Field, v string) bool {
		if err := spec.Set(f, v); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", key, err))
			return false
		}
		if _, ok := ann[key]; ok {
			if n := spec.ListItems(f); n > 0 {
				gave = append(gave, annotationItems{key, n})
			}
		}
		return true
	}
	for _, a := range annotationFields {
		v, ok := ann[a.key]
		if !ok {
			v = a.def
		}
		if v != "" && !set(a.key, a.field, v) {
			continue
		}
		if ok && a.istio != nil {
			if err := a.istio(v); err != nil {
				errs = append(errs, fmt.Errorf("annotation %s: %w", a.key, err))
			}
		}
	}
	// The current annotation wins when present, even empty; the deprecated one is
	// read only in its absence.
	virtKey := AnnotationRerouteVirtualInterfaces
	virtIfaces, ok := ann[virtKey]
	if !ok {
		virtKey = AnnotationKubevirtInterfaces
		virtIfaces = ann[virtKey]
	}
	if set(virtKey, redirect.FieldRerouteVirtualInterfaces, virtIfaces) {
		if err := checkInterfaceList(virtIfaces); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", virtKey, err))
		}
	}
	// The always excluded ports count towards the list's limit, so the pod's own
	// list can go over it only here, where the error can still name the annotation.
	given := len(spec.InboundPortsExclude)
	for _, p := range alwaysExcludedInboundPorts {
		if !slices.Contains(spec.InboundPortsExclude, p) {
			spec.InboundPortsExclude = append(spec.InboundPortsExclude, p)
		}
	}
	if n := len(spec.InboundPortsExclude); n > redirect.MaxListItems {
		errs = append(errs, fmt.Errorf("annotation %s: %d ports given; with %s, which are always excluded, that is %d, more than the limit of %d",
			AnnotationExcludeInboundPorts, given, portsText(alwaysExcludedInboundPorts), n, redirect.MaxListItems))
	}
	proxy, _, _ := pod.Container(ContainerIstioProxy)
	uid, gid, shared, err := ProxyIdentity(pod, proxy)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return redirect.Spec{}, podWarnings{}, podError(pod, err)
	}
	warn.shared = shared
	spec.ProxyUIDs = []uint32{uid}
	for _, extra := range cfg.ExtraBypassUIDs {
		if !slices.Contains(spec.ProxyUIDs, extra) {
			spec.ProxyUIDs = append(spec.ProxyUIDs, extra)
		}
	}
	spec.ProxyGIDs = []uint32{gid}
	// The plugin runs on the host and cannot read the pod's resolv.conf, so with DNS
	// capture it captures every query, as Istio's plugin does.
	proxyBool := func(name string) bool {
		b, bad := envBool(proxy, name)
		if bad != nil {
			warn.notBool = append(warn.notBool, *bad)
		}
		return b
	}
	dnsCapture := proxyBool(EnvDNSCapture)
	spec.DNS.Enabled, spec.DNS.CaptureAll = dnsCapture, dnsCapture
	spec.DropInvalid = proxyBool(EnvInvalidDrop)
	if len(podIPs) == 0 {
		podIPs = pod.IPs()
	}
	_, spec.IPv6, _ = redirect.PodAddress(podIPs, proxyBool(EnvDualStack))
	if err := spec.Validate(); err != nil {
		return redirect.Spec{}, podWarnings{}, podError(pod, nameAnnotationItems(err, gave))
	}
	return spec, warn, nil
}

// podWarnings are what the ADD warns of for a pod it captures (see PodPlan).
type podWarnings struct {
	notBool []EnvNotBool
	shared  []SharedProxyID
}

// annotationItems is how many list items (ports, CIDRs, interfaces) an
// annotation gave the capture.
type annotationItems struct {
	key string
	n   int
}

// nameAnnotationItems rewrites the spec's refusal of too many items in all
// (redirect.ItemsError), which can name no field, into one that names each
// annotation that gave items and how many, and what the plugin added; err's
// other refusals are kept as they are.
func nameAnnotationItems(err error, given []annotationItems) error {
	var ie *redirect.ItemsError
	if !errors.As(err, &ie) || len(given) == 0 {
		return err
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		if !errors.As(e, &ie) {
			out = append(out, e)
			continue
		}
		var b strings.Builder
		b.WriteString("annotation")
		if len(given) > 1 {
			b.WriteString("s")
		}
		fromAnnotations := 0
		names := make([]string, len(given))
		for i, g := range given {
			names[i] = fmt.Sprintf("%s (%d)", g.key, g.n)
			if i == 0 {
				names[i] = fmt.Sprintf("%s (%d items)", g.key, g.n)
			}
			fromAnnotations += g.n
		}
		b.WriteString(" " + andList(names))
		fmt.Fprintf(&b, ", with the %d items the plugin adds (the proxy's uid and gid, the inbound ports always excluded, extra_bypass_uids): %d items in all, more than the limit of %d",
			ie.Total-fromAnnotations, ie.Total, redirect.MaxSpecItems)
		out = append(out, errors.New(b.String()))
	}
	return errors.Join(out...)
}

// portsText is "15020, 15021 and 15090".
func portsText(ports []uint16) string {
	items := make([]string, len(ports))
	for i, p := range ports {
		items[i] = strconv.Itoa(int(p))
	}
	return andList(items)
}

// andList is "a", "a and b", "a, b and c": the lists the plugin's errors name.
func andList(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func podError(pod *kube.Pod, err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "pod " + pod.Key() + ": " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// ProxyIdentity is the uid and gid whose traffic is the proxy's: istio-proxy's
// runAsUser and runAsGroup, 1337 when unset or 0 (Istio's rule) or past 32 bits. Istio reads only
// the container's security context; a pod-level runAsUser (runAsGroup) is what the
// proxy then actually runs as, so it is used when the container sets none, but
// only when no other container runs as it too.
//
// The capture exempts every process that runs as the proxy's uid or gid, so
// shared are the other containers (init containers included, istio-validation,
// which runs as the proxy's identity by design, not) that run as either, each of
// whose traffic bypasses the proxy: the ADD warns of each. err is set when an id
// comes from the pod's security context and another container runs as it too:
// taking the pod's id would let that container's traffic bypass the proxy, and
// Istio's default would have the proxy capture its own, so the pod is refused
// (fail closed). The ADD, CHECK, repair and the doctor all get the identity, the
// warnings and the refusal here, through PlanFor.
func ProxyIdentity(pod *kube.Pod, proxy kube.Container) (uid, gid uint32, shared []SharedProxyID, err error) {
	var own kube.SecurityContext
	if proxy.SecurityContext != nil {
		own = *proxy.SecurityContext
	}
	u, g := proxy.RunAs(pod.Spec.SecurityContext)
	uid, gid = idOrDefault(u), idOrDefault(g)
	ids := [...]struct {
		kind, field string
		id          uint32
		// fromPod: the id is the pod's, istio-proxy setting none.
		fromPod bool
		of      func(u, g *int64) *int64
		set     func(sc *kube.SecurityContext) bool
	}{
		{"uid", "runAsUser", uid, own.RunAsUser == nil && validID(u),
			func(u, _ *int64) *int64 { return u }, func(sc *kube.SecurityContext) bool { return sc.RunAsUser != nil }},
		{"gid", "runAsGroup", gid, own.RunAsGroup == nil && validID(g),
			func(_, g *int64) *int64 { return g }, func(sc *kube.SecurityContext) bool { return sc.RunAsGroup != nil }},
	}
	var errs []error
	all := pod.AllContainers()
	for _, id := range ids {
		var sharing []SharedProxyID
		for i, c := range all {
			if c.Name == proxy.Name || c.Name == ContainerIstioValidation {
				continue
			}
			cu, cg := c.RunAs(pod.Spec.SecurityContext)
			if v := id.of(cu, cg); v == nil || *v != int64(id.id) {
				continue
			}
			sharing = append(sharing, SharedProxyID{
				Container: c.Name, Init: i < len(pod.Spec.InitContainers), Kind: id.kind, ID: id.id,
				Own: c.SecurityContext != nil && id.set(c.SecurityContext),
			})
		}
		if len(sharing) == 0 {
			continue
		}
		if id.fromPod {
			errs = append(errs, fmt.Errorf("istio-proxy sets no securityContext.%[1]s, so the proxy's %[2]s is the pod's securityContext.%[1]s, %[3]d, "+
				"and %[4]s %[5]s as %[2]s %[3]d too: the capture would exempt %[6]s traffic, which would bypass the proxy; "+
				"set istio-proxy's securityContext.%[1]s to a %[2]s no other container runs as (Istio's injector sets %[7]d)",
				id.field, id.kind, id.id, containersText(sharing), runsOrRun(sharing), itsOrTheir(sharing), redirect.DefaultProxyUID))
			continue
		}
		shared = append(shared, sharing...)
	}
	if err := errors.Join(errs...); err != nil {
		return 0, 0, nil, err
	}
	return uid, gid, shared, nil
}

// containersText is "the container app" or "the containers app and setup (init)".
func containersText(cs []SharedProxyID) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Container
		if c.Init {
			names[i] += " (init)"
		}
	}
	if len(cs) > 1 {
		return "the containers " + andList(names)
	}
	return "the container " + andList(names)
}

func runsOrRun(cs []SharedProxyID) string {
	if len(cs) > 1 {
		return "run"
	}
	return "runs"
}

func itsOrTheir(cs []SharedProxyID) string {
	if len(cs) > 1 {
		return "their"
	}
	return "its"
}

// idOrDefault is a security context's uid or gid as the proxy's: the default
// (1337) when unset, 0 or out of range (see validID).
func idOrDefault(id *int64) uint32 {
	if !validID(id) {
		return redirect.DefaultProxyUID
	}
	return uint32(*id)
}

// validID reports whether id is set and usable as the proxy's uid or gid: not 0
// (Istio's "unset") and within the kernel's 32 bits.
func validID(id *int64) bool {
	return id != nil && *id > 0 && *id <= 1<<32-1
}

// SharedProxyID is another container of the pod that runs as the proxy's uid or
// gid (see ProxyIdentity): the capture exempts its traffic too, so that traffic
// bypasses the proxy. Istio's plugin allows it, and some pods do it on purpose
// (an init container that must reach a server before the proxy is up, say), so
// the ADD allows it and warns.
type SharedProxyID struct {
	Container string `json:"container"`
	// Init: Container is an init container.
	Init bool `json:"init,omitempty"`
	// Kind is "uid" or "gid", ID its value.
	Kind string `json:"kind"`
	ID   uint32 `json:"id"`
	// Own: the container sets it in its own security context; else it inherits
	// the pod's.
	Own bool `json:"own,omitempty"`
}

// SharedProxyIDWarning is what the ADD warns of a SharedProxyID: its log's
// message, with the container, the uid or gid and where it comes from as fields.
const SharedProxyIDWarning = "another container runs as the proxy's uid or gid: the capture exempts its traffic, " +
	"which bypasses the proxy (as with Istio's plugin)"

// From is where the container's id comes from: "container" (its own security
// context) or "pod" (the pod's).
func (s SharedProxyID) From() string {
	if s.Own {
		return "container"
	}
	return "pod"
}

// Warning is the ADD's warning of s in one line, its fields after it as the log
// has them: what the doctor's explain and inspect print.
func (s SharedProxyID) Warning() string {
	return fmt.Sprintf("%s (container %s, %s %d, from %s)", SharedProxyIDWarning, s.Container, s.Kind, s.ID, s.From())
}

// EnvNotBool is a variable of the sidecar's environment that shapes the capture
// and holds no boolean: it counts as false.
type EnvNotBool struct {
	Container, Name, Value string
}

// EnvNotBoolWarning is what the ADD warns of an EnvNotBool: its log's message,
// with the container, the variable and the value as fields.
const EnvNotBoolWarning = "a variable of the sidecar's environment is not a boolean (true or false, 1 or 0): " +
	"the capture takes it as false, as Istio's proxy and istio-init do"

// Warning is the ADD's warning of e in one line, its fields after it as the log
// has them: what the doctor's explain and inspect print.
func (e EnvNotBool) Warning() string {
	return fmt.Sprintf("%s (container %s, variable %s, value %q)", EnvNotBoolWarning, e.Container, e.Name, e.Value)
}

// envBool reads a boolean from the sidecar container c's environment as Istio's
// proxy and plugin do: strconv.ParseBool's forms (1, t, T, TRUE, true, True and
// their false counterparts), anything else, or absence, is false. A value that is
// present and not one of those forms ("yes", "on ", "", and a valueFrom variable,
// which the plugin reads empty) is returned in bad, so that the ADD can warn of
// it: the proxy takes it as false too and warns in its own log, so capture and
// proxy agree, but neither does what the value seems to ask.
func envBool(c kube.Container, name string) (b bool, bad *EnvNotBool) {
	v, ok := c.Getenv(name)
	if !ok {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &EnvNotBool{Container: c.Name, Name: name, Value: v}
	}
	return b, nil
}
