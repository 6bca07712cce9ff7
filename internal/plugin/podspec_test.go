package plugin

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

var specOpts = cmp.Options{
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmpopts.EquateEmpty(),
}

// istioDefaultSpec is what Istio's plugin programs for an injected pod without
// traffic annotations: capture all inbound but the agent's ports, all outbound but
// the status port, proxy 1337:1337, no DNS capture, IPv4 only.
func istioDefaultSpec() redirect.Spec {
	s := redirect.DefaultSpec()
	s.InboundPorts = redirect.PortSet{All: true}
	s.InboundPortsExclude = []uint16{15020, 15021, 15090}
	s.OutboundCIDRs = redirect.PrefixSet{All: true}
	s.OutboundPortsExclude = []uint16{15020}
	s.OwnerGroups = redirect.GroupFilter{Except: true}
	return s
}

var prefixes = specs.Prefixes

var addrs = specs.Addrs

func int64p(v int64) *int64 { return &v }

func withProxySecurity(uid, gid *int64) func(p *kube.Pod) {
	return func(p *kube.Pod) { proxyOf(p).SecurityContext = &kube.SecurityContext{RunAsUser: uid, RunAsGroup: gid} }
}

func TestSpecFromPod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pod    *kube.Pod
		cfg    func(c *Config)
		podIPs []netip.Addr
		want   func(s *redirect.Spec)
	}{
		{name: "no annotations: Istio's CNI defaults", pod: injectedPod()},
		{name: "TPROXY interception", pod: injectedPod(withAnnotation(AnnotationInterceptionMode, "TPROXY")),
			want: func(s *redirect.Spec) { s.Mode = redirect.ModeTProxy }},
		{name: "REDIRECT interception", pod: injectedPod(withAnnotation(AnnotationInterceptionMode, "REDIRECT"))},
		{name: "include outbound ranges", pod: injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.0.0.0/8,172.16.0.0/12")),
			want: func(s *redirect.Spec) {
				s.OutboundCIDRs = redirect.PrefixSet{Prefixes: prefixes("10.0.0.0/8", "172.16.0.0/12")}
			}},
		{name: "include outbound ranges empty captures no outbound range", pod: injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "")),
			want: func(s *redirect.Spec) { s.OutboundCIDRs = redirect.PrefixSet{} }},
		{name: "include outbound range with host bits is masked", pod: injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.1.2.3/8")),
			want: func(s *redirect.Spec) { s.OutboundCIDRs = redirect.PrefixSet{Prefixes: prefixes("10.0.0.0/8")} }},
		{name: "exclude outbound ranges", pod: injectedPod(withAnnotation(AnnotationExcludeOutboundIPRanges, "169.254.169.254/32,fd00::/8")),
			want: func(s *redirect.Spec) { s.OutboundCIDRsExclude = prefixes("169.254.169.254/32", "fd00::/8") }},
		{name: "include inbound ports replaces the wildcard", pod: injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "8080,9090")),
			want: func(s *redirect.Spec) { s.InboundPorts = redirect.PortSet{Ports: []uint16{8080, 9090}} }},
		{name: "include inbound ports empty captures no inbound", pod: injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "")),
			want: func(s *redirect.Spec) { s.InboundPorts = redirect.PortSet{} }},
		{name: "exclude inbound ports keep the agent's ports excluded", pod: injectedPod(withAnnotation(AnnotationExcludeInboundPorts, "8443")),
			want: func(s *redirect.Spec) { s.InboundPortsExclude = []uint16{8443, 15020, 15021, 15090} }},
		{name: "exclude inbound ports deduplicated, items trimmed as Istio's plugin does", pod: injectedPod(withAnnotation(AnnotationExcludeInboundPorts, " 15021, 8443 ,15021")),
			want: func(s *redirect.Spec) { s.InboundPortsExclude = []uint16{15021, 8443, 15020, 15090} }},
		{name: "exclude inbound ports: 256 in all with the agent's ports", pod: injectedPod(withAnnotation(AnnotationExcludeInboundPorts, "15090,"+portList(1, 253)+",15020")),
			want: func(s *redirect.Spec) {
				s.InboundPortsExclude = append(append([]uint16{15090}, portRange(1, 253)...), 15020, 15021)
			}},
		{name: "exclude inbound ports empty still excludes the agent's ports", pod: injectedPod(withAnnotation(AnnotationExcludeInboundPorts, ""))},
		{name: "exclude inbound ports blank is empty, as Istio's plugin trims it", pod: injectedPod(withAnnotation(AnnotationExcludeInboundPorts, "  "))},
		{name: "include outbound ports", pod: injectedPod(withAnnotation(AnnotationIncludeOutboundPorts, "443")),
			want: func(s *redirect.Spec) { s.OutboundPorts = []uint16{443} }},
		{name: "exclude outbound ports replace the status port default", pod: injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, "5432,6379")),
			want: func(s *redirect.Spec) { s.OutboundPortsExclude = []uint16{5432, 6379} }},
		{name: "exclude outbound ports empty excludes nothing", pod: injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, "")),
			want: func(s *redirect.Spec) { s.OutboundPortsExclude = nil }},
		{name: "exclude interfaces", pod: injectedPod(withAnnotation(AnnotationExcludeInterfaces, "net1,eth1")),
			want: func(s *redirect.Spec) { s.ExcludeInterfaces = []string{"net1", "eth1"} }},
		{name: "exclude interfaces with spaces around them, which Istio's check trims", pod: injectedPod(withAnnotation(AnnotationExcludeInterfaces, " net1, eth1 ")),
			want: func(s *redirect.Spec) { s.ExcludeInterfaces = []string{"net1", "eth1"} }},
		{name: "exclude interfaces empty excludes none", pod: injectedPod(withAnnotation(AnnotationExcludeInterfaces, ""))},
		{name: "interface names of every character Istio's check takes", pod: injectedPod(withAnnotation(AnnotationExcludeInterfaces, "eth0.100,br_ex,veth-a1,Net9")),
			want: func(s *redirect.Spec) { s.ExcludeInterfaces = []string{"eth0.100", "br_ex", "veth-a1", "Net9"} }},
		{name: "kubevirt interfaces (deprecated) reroute", pod: injectedPod(withAnnotation(AnnotationKubevirtInterfaces, "k6t-eth0")),
			want: func(s *redirect.Spec) { s.RerouteVirtualInterfaces = []string{"k6t-eth0"} }},
		{name: "reroute-virtual-interfaces", pod: injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, "tap0")),
			want: func(s *redirect.Spec) { s.RerouteVirtualInterfaces = []string{"tap0"} }},
		{name: "reroute-virtual-interfaces wins over kubevirtInterfaces",
			pod:  injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, "tap0"), withAnnotation(AnnotationKubevirtInterfaces, "k6t-eth0")),
			want: func(s *redirect.Spec) { s.RerouteVirtualInterfaces = []string{"tap0"} }},
		{name: "empty reroute-virtual-interfaces still hides kubevirtInterfaces",
			pod: injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, ""), withAnnotation(AnnotationKubevirtInterfaces, "k6t-eth0"))},
		{name: "DNS capture captures all DNS", pod: injectedPod(withProxyEnv(EnvDNSCapture, "true")),
			want: func(s *redirect.Spec) { s.DNS = redirect.DNS{Enabled: true, CaptureAll: true} }},
		{name: "DNS capture unparseable is off", pod: injectedPod(withProxyEnv(EnvDNSCapture, "on"))},
		{name: "INVALID_DROP", pod: injectedPod(withProxyEnv(EnvInvalidDrop, "true")),
			want: func(s *redirect.Spec) { s.DropInvalid = true }},
		{name: "proxy uid and gid from istio-proxy's security context", pod: injectedPod(withProxySecurity(int64p(1000650000), int64p(1000650001))),
			want: func(s *redirect.Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{1000650000}, []uint32{1000650001} }},
		{name: "custom uid alone keeps gid 1337", pod: injectedPod(withProxySecurity(int64p(1000650000), nil)),
			want: func(s *redirect.Spec) { s.ProxyUIDs = []uint32{1000650000} }},
		{name: "uid 0 means the default", pod: injectedPod(withProxySecurity(int64p(0), int64p(0)))},
		{name: "pod-level runAsUser applies when istio-proxy sets none and no other container runs as it", pod: injectedPod(func(p *kube.Pod) {
			p.Spec.SecurityContext = &kube.PodSecurityContext{RunAsUser: int64p(2000)}
		}, withContainerSecurity("app", int64p(1000), nil)), want: func(s *redirect.Spec) { s.ProxyUIDs = []uint32{2000} }},
		{name: "istio-proxy's runAsUser wins over the pod's", pod: injectedPod(withProxySecurity(int64p(1337), nil), func(p *kube.Pod) {
			p.Spec.SecurityContext = &kube.PodSecurityContext{RunAsUser: int64p(2000)}
		})},
		{name: "native sidecar's identity and environment are read", pod: injectedPod(nativeSidecar, withProxySecurity(int64p(1234), nil), withProxyEnv(EnvDNSCapture, "1")),
			want: func(s *redirect.Spec) {
				s.ProxyUIDs = []uint32{1234}
				s.DNS = redirect.DNS{Enabled: true, CaptureAll: true}
			}},
		{name: "extra bypass uids follow the proxy uid", pod: injectedPod(withProxySecurity(int64p(1000650000), nil)),
			cfg:  func(c *Config) { c.ExtraBypassUIDs = []uint32{1337, 1000660000} },
			want: func(s *redirect.Spec) { s.ProxyUIDs = []uint32{1000650000, 1337, 1000660000} }},
		{name: "extra bypass uid equal to the proxy's is not repeated", pod: injectedPod(),
			cfg:  func(c *Config) { c.ExtraBypassUIDs = []uint32{1337, 1001} },
			want: func(s *redirect.Spec) { s.ProxyUIDs = []uint32{1337, 1001} }},
		{name: "IPv6 pod address enables IPv6", pod: injectedPod(), podIPs: addrs("fd00::5"),
			want: func(s *redirect.Spec) { s.IPv6 = true }},
		{name: "IPv4 first without dual stack stays IPv4", pod: injectedPod(), podIPs: addrs("10.0.0.5", "fd00::5")},
		// Istio reads the namespace, where the kernel lists IPv4 addresses before
		// IPv6 ones; a previous plugin may list IPv6 first (Cilium's result does).
		{name: "IPv6 listed first (Cilium's result) without dual stack stays IPv4", pod: injectedPod(), podIPs: addrs("fd00::5", "10.0.0.5")},
		{name: "IPv6 listed first with ISTIO_DUAL_STACK enables IPv6", pod: injectedPod(withProxyEnv(EnvDualStack, "true")), podIPs: addrs("fd00::5", "10.0.0.5"),
			want: func(s *redirect.Spec) { s.IPv6 = true }},
		{name: "IPv4 first with ISTIO_DUAL_STACK enables IPv6", pod: injectedPod(withProxyEnv(EnvDualStack, "true")), podIPs: addrs("10.0.0.5", "fd00::5"),
			want: func(s *redirect.Spec) { s.IPv6 = true }},
		{name: "link-local and loopback addresses do not decide", pod: injectedPod(), podIPs: addrs("::1", "fe80::1", "fd00::5"),
			want: func(s *redirect.Spec) { s.IPv6 = true }},
		{name: "pod status addresses are used when none are given", pod: injectedPod(func(p *kube.Pod) {
			p.Status.PodIPs = []kube.PodIP{{IP: "fd00::9"}}
		}), want: func(s *redirect.Spec) { s.IPv6 = true }},
		{name: "given addresses win over the pod status", pod: injectedPod(func(p *kube.Pod) {
			p.Status.PodIPs = []kube.PodIP{{IP: "fd00::9"}}
		}), podIPs: addrs("10.0.0.5")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.cfg)
			got, _, err := specFromPod(tc.pod, cfg, tc.podIPs)
			if err != nil {
				t.Fatalf("SpecFromPod: %v", err)
			}
			want := istioDefaultSpec()
			if tc.want != nil {
				tc.want(&want)
			}
			if diff := cmp.Diff(want, got, specOpts); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if _, err := redirect.Build(got); err != nil {
				t.Errorf("the spec does not build: %v", err)
			}
		})
	}
}

func TestSpecFromPodErrorsNameThePodAnnotationAndValue(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *kube.Pod
		want string
	}{
		{"port out of range", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "70000")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: "70000" is not a port (1-65535)`},
		{"wildcard mixed with ports", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "*,80")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: "*" is not a port (1-65535)`},
		{"wildcard in exclude inbound ports", injectedPod(withAnnotation(AnnotationExcludeInboundPorts, "*")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInboundPorts: "*" is not a port (1-65535)`},
		{"bad exclude outbound port", injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, "http")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundPorts: "http" is not a port (1-65535)`},
		{"bad include outbound port", injectedPod(withAnnotation(AnnotationIncludeOutboundPorts, "0")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundPorts: "0" is not a port (1-65535)`},
		{"empty interception mode", injectedPod(withAnnotation(AnnotationInterceptionMode, "")),
			`pod default/web-1: annotation sidecar.istio.io/interceptionMode: "" is not an interception mode: Istio's plugin takes exactly REDIRECT or TPROXY (without the annotation the mode is REDIRECT)`},
		{"interception mode with a space", injectedPod(withAnnotation(AnnotationInterceptionMode, " TPROXY")),
			`pod default/web-1: annotation sidecar.istio.io/interceptionMode: " TPROXY" is not an interception mode: Istio's plugin takes exactly REDIRECT or TPROXY`},
		{"empty item in a port list", injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, "80,,443")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundPorts: "80,,443" has an empty item: Istio's plugin refuses it`},
		{"trailing comma in a port list", injectedPod(withAnnotation(AnnotationExcludeInboundPorts, "15021,8443,")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInboundPorts: "15021,8443," has an empty item: Istio's plugin refuses it`},
		{"blank include inbound ports", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, " ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: " " is blank: Istio's plugin fails the ADD on it (its rule names no port); an empty value means no ports`},
		{"blank include outbound ports", injectedPod(withAnnotation(AnnotationIncludeOutboundPorts, "  ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundPorts: "  " is blank: Istio's plugin fails the ADD on it (its rule names no port); an empty value means no ports`},
		{"blank exclude outbound ports", injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, " ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundPorts: " " is blank: Istio's plugin fails the ADD on it (its rule names no port); an empty value means no ports`},
		{"a port with a leading zero", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "80,010")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: "010" is not a port: it has a leading zero, which iptables reads as octal (write 10, or the octal value's port)`},
		{"a port list of commas", injectedPod(withAnnotation(AnnotationIncludeOutboundPorts, ",")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundPorts: "," has an empty item: Istio's plugin refuses it`},
		{"port wildcard with spaces", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, " * ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: " * " is not the wildcard: Istio's plugin takes "*" only without spaces`},
		{"range wildcard with spaces", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "* ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: "* " is not the wildcard: Istio's plugin takes "*" only without spaces`},
		{"address without a prefix length", injectedPod(withAnnotation(AnnotationExcludeOutboundIPRanges, "10.0.0.1")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundIPRanges: "10.0.0.1" has no prefix length: Istio's plugin takes only CIDRs (for this address alone, "10.0.0.1/32")`},
		{"IPv6 address without a prefix length", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.0.0.0/8,fd00::1")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: "fd00::1" has no prefix length: Istio's plugin takes only CIDRs (for this address alone, "fd00::1/128")`},
		{"space after a comma in a range list", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.0.0.0/8, 192.168.0.0/16")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: "10.0.0.0/8, 192.168.0.0/16" has spaces around "192.168.0.0/16": Istio's plugin does not trim list items, so it refuses them`},
		{"space before a comma in a range list", injectedPod(withAnnotation(AnnotationExcludeOutboundIPRanges, "10.0.0.0/8 ,192.168.0.0/16")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundIPRanges: "10.0.0.0/8 ,192.168.0.0/16" has spaces around "10.0.0.0/8": Istio's plugin does not trim list items, so it refuses them`},
		{"trailing comma in a range list", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.0.0.0/8,")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: "10.0.0.0/8," has an empty item: Istio's plugin refuses it`},
		{"blank range list", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, " ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: " " is blank: Istio's plugin refuses it (an empty value means no ranges)`},
		{"bad interception mode", injectedPod(withAnnotation(AnnotationInterceptionMode, "NONE")),
			`pod default/web-1: annotation sidecar.istio.io/interceptionMode: "NONE" is not an interception mode (REDIRECT or TPROXY)`},
		{"bad include range", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, "10.0.0.0/33")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: "10.0.0.0/33" is not a CIDR`},
		{"bad exclude range", injectedPod(withAnnotation(AnnotationExcludeOutboundIPRanges, "example.com")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundIPRanges: "example.com" is not an IP address or CIDR`},
		{"exclude every range", injectedPod(withAnnotation(AnnotationExcludeOutboundIPRanges, "*")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundIPRanges: "*" is not allowed: it would exclude everything`},
		{"wildcard interface exclusion", injectedPod(withAnnotation(AnnotationExcludeInterfaces, "eth+")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInterfaces: "eth+" is not an interface name (character '+' not allowed)`},
		{"bad kubevirt interface", injectedPod(withAnnotation(AnnotationKubevirtInterfaces, "a-very-long-interface-name")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/kubevirtInterfaces: "a-very-long-interface-name" is not an interface name (1-15 characters)`},
		// Istio's plugin checks the interface annotations (ValidateInterfaceNames).
		{"blank interface list", injectedPod(withAnnotation(AnnotationExcludeInterfaces, "  ")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInterfaces: "  " is blank: Istio's plugin refuses it (an empty value means no interfaces)`},
		{"empty item in an interface list", injectedPod(withAnnotation(AnnotationExcludeInterfaces, "eth0,,eth1")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInterfaces: "eth0,,eth1" has an empty item: Istio's plugin refuses it`},
		{"trailing comma in a reroute list", injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, "tap0,")),
			`pod default/web-1: annotation istio.io/reroute-virtual-interfaces: "tap0," has an empty item: Istio's plugin refuses it`},
		{"interface name starting with a digit", injectedPod(withAnnotation(AnnotationExcludeInterfaces, "eth0,1eth")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInterfaces: "1eth" is not an interface name Istio's plugin takes (a letter first, then letters, digits, _, . and -)`},
		{"interface name with an @", injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, "veth@1")),
			`pod default/web-1: annotation istio.io/reroute-virtual-interfaces: "veth@1" is not an interface name Istio's plugin takes (a letter first, then letters, digits, _, . and -)`},
		{"deprecated kubevirt interface starting with _", injectedPod(withAnnotation(AnnotationKubevirtInterfaces, "_k6t")),
			`pod default/web-1: annotation traffic.sidecar.istio.io/kubevirtInterfaces: "_k6t" is not an interface name Istio's plugin takes (a letter first, then letters, digits, _, . and -)`},
		{"bad reroute interface", injectedPod(withAnnotation(AnnotationRerouteVirtualInterfaces, "tap 0")),
			`pod default/web-1: annotation istio.io/reroute-virtual-interfaces: "tap 0" is not an interface name (character ' ' not allowed)`},
		{"a value longer than 16 KiB is refused and quoted by its start", injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, strings.Repeat("1,", 512<<10))),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundPorts: "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"... (1048576 bytes) is 1048576 bytes, longer than the limit of 16384`},
		{"too many ports", injectedPod(withAnnotation(AnnotationExcludeOutboundPorts, portList(1, 257))),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeOutboundPorts: 257 items given, at most 256 are supported`},
		{"too many excluded inbound ports with the agent's", injectedPod(withAnnotation(AnnotationExcludeInboundPorts, portList(20000, 254))),
			`pod default/web-1: annotation traffic.sidecar.istio.io/excludeInboundPorts: 254 ports given; with 15020, 15021 and 15090, which are always excluded, that is 257, more than the limit of 256`},
		{"too many CIDRs", injectedPod(withAnnotation(AnnotationIncludeOutboundIPRanges, cidrList(300))),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeOutboundIPRanges: 300 items given, at most 256 are supported`},
		{"too many items in all", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, portList(1, 256)), withAnnotation(AnnotationExcludeOutboundPorts, portList(1000, 256)),
			withAnnotation(AnnotationIncludeOutboundPorts, portList(2000, 256)), withAnnotation(AnnotationIncludeOutboundIPRanges, cidrList(256))),
			`pod default/web-1: annotations traffic.sidecar.istio.io/includeOutboundIPRanges (256 items), traffic.sidecar.istio.io/includeInboundPorts (256), ` +
				`traffic.sidecar.istio.io/includeOutboundPorts (256) and traffic.sidecar.istio.io/excludeOutboundPorts (256), with the 5 items the plugin adds ` +
				`(the proxy's uid and gid, the inbound ports always excluded, extra_bypass_uids): 1029 items in all, more than the limit of 1024`},
		{"too many items in all, from fewer annotations", injectedPod(withAnnotation(AnnotationExcludeInboundPorts, portList(1, 253)), withAnnotation(AnnotationIncludeOutboundPorts, portList(2000, 256)),
			withAnnotation(AnnotationExcludeOutboundPorts, portList(3000, 256)), withAnnotation(AnnotationExcludeInterfaces, ifaceList(256))),
			`pod default/web-1: annotations traffic.sidecar.istio.io/excludeInboundPorts (253 items), traffic.sidecar.istio.io/includeOutboundPorts (256), ` +
				`traffic.sidecar.istio.io/excludeOutboundPorts (256) and traffic.sidecar.istio.io/excludeInterfaces (256), with the 5 items the plugin adds ` +
				`(the proxy's uid and gid, the inbound ports always excluded, extra_bypass_uids): 1026 items in all, more than the limit of 1024`},
		{"a long bad item is quoted by its start", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, strings.Repeat("x", 1000))),
			`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"... (1000 bytes) is not a port (1-65535)`},
		{"every bad annotation is reported", injectedPod(withAnnotation(AnnotationIncludeInboundPorts, "x"), withAnnotation(AnnotationInterceptionMode, "y")),
			"pod default/web-1: annotation sidecar.istio.io/interceptionMode: \"y\" is not an interception mode (REDIRECT or TPROXY)\n" +
				`pod default/web-1: annotation traffic.sidecar.istio.io/includeInboundPorts: "x" is not a port (1-65535)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := specFromPod(tc.pod, testConfig(), nil)
			if err == nil {
				t.Fatalf("SpecFromPod succeeded, want %s", tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

// portList is "first,first+1,..." with n ports.
func portList(first, n int) string {
	ports := make([]string, n)
	for i := range ports {
		ports[i] = strconv.Itoa(first + i)
	}
	return strings.Join(ports, ",")
}

// portRange is first, first+1, ... with n ports.
func portRange(first, n int) []uint16 {
	ports := make([]uint16, n)
	for i := range ports {
		ports[i] = uint16(first + i)
	}
	return ports
}

// cidrList is n distinct /32s.
func cidrList(n int) string {
	cidrs := make([]string, n)
	for i := range cidrs {
		cidrs[i] = fmt.Sprintf("10.1.%d.%d/32", i/250, i%250+1)
	}
	return strings.Join(cidrs, ",")
}

// ifaceList is n interface names, eth0, eth1, ...
func ifaceList(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "eth" + strconv.Itoa(i)
	}
	return strings.Join(names, ",")
}

// TestEnvBoolTakesIstiosFormsAndReportsTheRest: a variable of the sidecar's
// environment is read as Istio's proxy reads it (strconv.ParseBool); any other
// value present is false, as for the proxy, and is reported, naming the
// container, the variable and the value, for the ADD's warning. An absent
// variable is false and not reported.
func TestEnvBoolTakesIstiosFormsAndReportsTheRest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []kube.EnvVar
		want    bool
		wantBad bool
	}{
		{"absent", nil, false, false},
		{"true", []kube.EnvVar{{Name: EnvDNSCapture, Value: "true"}}, true, false},
		{"TRUE", []kube.EnvVar{{Name: EnvDNSCapture, Value: "TRUE"}}, true, false},
		{"1", []kube.EnvVar{{Name: EnvDNSCapture, Value: "1"}}, true, false},
		{"t", []kube.EnvVar{{Name: EnvDNSCapture, Value: "t"}}, true, false},
		{"false", []kube.EnvVar{{Name: EnvDNSCapture, Value: "false"}}, false, false},
		{"0", []kube.EnvVar{{Name: EnvDNSCapture, Value: "0"}}, false, false},
		{"yes", []kube.EnvVar{{Name: EnvDNSCapture, Value: "yes"}}, false, true},
		{"on with a trailing space", []kube.EnvVar{{Name: EnvDNSCapture, Value: "on "}}, false, true},
		{"true with a leading space", []kube.EnvVar{{Name: EnvDNSCapture, Value: " true"}}, false, true},
		{"empty (or set by valueFrom)", []kube.EnvVar{{Name: EnvDNSCapture}}, false, true},
		{"the last of a repeated variable wins", []kube.EnvVar{{Name: EnvDNSCapture, Value: "yes"}, {Name: EnvDNSCapture, Value: "true"}}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := kube.Container{Name: ContainerIstioProxy, Env: tc.env}
			got, bad := envBool(c, EnvDNSCapture)
			if got != tc.want {
				t.Errorf("envBool = %v, want %v", got, tc.want)
			}
			var wantBad *EnvNotBool
			if tc.wantBad {
				wantBad = &EnvNotBool{Container: ContainerIstioProxy, Name: EnvDNSCapture, Value: tc.env[len(tc.env)-1].Value}
			}
			if diff := cmp.Diff(wantBad, bad); diff != "" {
				t.Errorf("reported (-want +got):\n%s", diff)
			}
		})
	}
}
