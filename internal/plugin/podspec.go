package plugin

import (
	"errors"
	"fmt"
	"net/netip"
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
	// alwaysExcludedInboundPorts are added to any excludeInboundPorts: the agent's
	// status, health and Prometheus ports.
	alwaysExcludedInboundPorts = "15020,15021,15090"
)

// SpecFromPod builds the capture spec of a pod that Decide selected for redirection,
// as Istio's plugin does: the traffic annotations with Istio's CNI defaults, the
// istio-proxy container's environment and identity, and IPv6 from the pod's
// addresses. podIPs are the sandbox's addresses (the previous plugin's result);
// when empty, the pod's status addresses are used. The node's extra_bypass_uids are
// added to the proxy's uids. Every error names the pod, the annotation and the value.
func SpecFromPod(pod *kube.Pod, cfg *Config, podIPs []netip.Addr) (redirect.Spec, error) {
	ann := pod.Metadata.Annotations
	get := func(key, def string) string {
		if v, ok := ann[key]; ok {
			return v
		}
		return def
	}
	var errs []error
	check := func(key string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", key, err))
		}
	}
	// Each annotation is checked with the parser Options.Spec uses, so that an error
	// names the annotation rather than the option it feeds.
	mode := get(AnnotationInterceptionMode, "REDIRECT")
	_, err := redirect.ParseMode(mode)
	check(AnnotationInterceptionMode, err)
	includeCIDRs := get(AnnotationIncludeOutboundIPRanges, defaultOutboundIPRanges)
	_, err = redirect.ParsePrefixSet(includeCIDRs)
	check(AnnotationIncludeOutboundIPRanges, err)
	excludeCIDRs := get(AnnotationExcludeOutboundIPRanges, "")
	if strings.TrimSpace(excludeCIDRs) == "*" {
		check(AnnotationExcludeOutboundIPRanges, errors.New(`"*" is not allowed: it would exclude everything`))
	} else {
		_, err = redirect.ParsePrefixList(excludeCIDRs)
		check(AnnotationExcludeOutboundIPRanges, err)
	}
	inboundPorts := get(AnnotationIncludeInboundPorts, defaultInboundPorts)
	_, err = redirect.ParsePortSet(inboundPorts)
	check(AnnotationIncludeInboundPorts, err)
	excludeInbound := get(AnnotationExcludeInboundPorts, defaultExcludeInboundPorts)
	_, err = redirect.ParsePortList(excludeInbound)
	check(AnnotationExcludeInboundPorts, err)
	outboundPorts := get(AnnotationIncludeOutboundPorts, "")
	_, err = redirect.ParsePortList(outboundPorts)
	check(AnnotationIncludeOutboundPorts, err)
	excludeOutbound := get(AnnotationExcludeOutboundPorts, defaultExcludeOutboundPorts)
	_, err = redirect.ParsePortList(excludeOutbound)
	check(AnnotationExcludeOutboundPorts, err)
	excludeIfaces := get(AnnotationExcludeInterfaces, "")
	_, err = redirect.ParseInterfaceList(excludeIfaces)
	check(AnnotationExcludeInterfaces, err)
	// The current annotation wins when present, even empty; the deprecated one is
	// read only in its absence.
	virtKey := AnnotationRerouteVirtualInterfaces
	virtIfaces, ok := ann[virtKey]
	if !ok {
		virtKey = AnnotationKubevirtInterfaces
		virtIfaces = ann[virtKey]
	}
	_, err = redirect.ParseInterfaceList(virtIfaces)
	check(virtKey, err)
	if err := errors.Join(errs...); err != nil {
		return redirect.Spec{}, podError(pod, err)
	}

	proxy, _, _ := pod.Container(ContainerIstioProxy)
	uid, gid := ProxyIdentity(pod, proxy)
	uids := []string{strconv.FormatUint(uint64(uid), 10)}
	for _, extra := range cfg.ExtraBypassUIDs {
		if extra != uid {
			uids = append(uids, strconv.FormatUint(uint64(extra), 10))
		}
	}
	dnsCapture := envBool(proxy, EnvDNSCapture)
	dualStack := envBool(proxy, EnvDualStack)
	if len(podIPs) == 0 {
		podIPs = pod.IPs()
	}
	opts := redirect.Options{
		InboundInterceptionMode:  mode,
		ProxyUID:                 strings.Join(uids, ","),
		ProxyGID:                 strconv.FormatUint(uint64(gid), 10),
		InboundPortsInclude:      inboundPorts,
		InboundPortsExclude:      appendPorts(excludeInbound, alwaysExcludedInboundPorts),
		OutboundIPRangesInclude:  includeCIDRs,
		OutboundIPRangesExclude:  excludeCIDRs,
		OutboundPortsInclude:     outboundPorts,
		OutboundPortsExclude:     excludeOutbound,
		ExcludeInterfaces:        excludeIfaces,
		RerouteVirtualInterfaces: virtIfaces,
		// The plugin runs on the host and cannot read the pod's resolv.conf, so with
		// DNS capture it captures every query, as Istio's plugin does.
		RedirectDNS:   dnsCapture,
		CaptureAllDNS: dnsCapture,
		DropInvalid:   envBool(proxy, EnvInvalidDrop),
		EnableIPv6:    captureIPv6(podIPs, dualStack),
	}
	spec, err := opts.Spec()
	if err != nil {
		return redirect.Spec{}, podError(pod, err)
	}
	return spec, nil
}

func podError(pod *kube.Pod, err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "pod " + pod.Key() + ": " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// ProxyIdentity is the uid and gid whose traffic is the proxy's: istio-proxy's
// runAsUser and runAsGroup, 1337 when unset or 0 (Istio's rule). Istio reads only
// the container's security context; a pod-level runAsUser is what the proxy then
// actually runs as, so it is used when the container sets none.
func ProxyIdentity(pod *kube.Pod, proxy kube.Container) (uid, gid uint32) {
	u, g := proxy.RunAs(pod.Spec.SecurityContext)
	return idOrDefault(u), idOrDefault(g)
}

func idOrDefault(id *int64) uint32 {
	if id == nil || *id <= 0 || *id > 1<<32-1 {
		return redirect.DefaultProxyUID
	}
	return uint32(*id)
}

// envBool reads a boolean from istio-proxy's environment as Istio does: strconv's
// forms, anything else (or absence) is false.
func envBool(c kube.Container, name string) bool {
	v, ok := c.Getenv(name)
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

// appendPorts appends extra to a port list, dropping duplicates later.
func appendPorts(list, extra string) string {
	list = strings.TrimRight(strings.TrimSpace(list), ",")
	if list == "" {
		return extra
	}
	return list + "," + extra
}

// captureIPv6 decides IPv6 capture from the sandbox's addresses with the rule
// istio-iptables applies inside the pod (see redirect.PodAddress).
func captureIPv6(addrs []netip.Addr, dualStack bool) bool {
	_, ipv6, _ := redirect.PodAddress(addrs, dualStack)
	return ipv6
}
