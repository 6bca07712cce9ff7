package redirect

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Options are Istio's capture settings in the string forms that istio-iptables' flags,
// its environment variables and the pod annotations use. Spec validates them into a
// Spec. Field names follow Istio's configuration.
type Options struct {
	ProxyPort                string
	InboundCapturePort       string
	InboundTunnelPort        string
	ProxyUID                 string
	ProxyGID                 string
	InboundInterceptionMode  string
	InboundTProxyMark        string
	InboundTProxyRouteTable  string
	InboundPortsInclude      string
	InboundPortsExclude      string
	OutboundIPRangesInclude  string
	OutboundIPRangesExclude  string
	OutboundPortsInclude     string
	OutboundPortsExclude     string
	RerouteVirtualInterfaces string
	ExcludeInterfaces        string
	OwnerGroupsInclude       string
	OwnerGroupsExclude       string
	HostIPv4LoopbackCidr     string
	RedirectDNS              bool
	CaptureAllDNS            bool
	DNSServers               []string
	DropInvalid              bool
	EnableIPv6               bool
}

// Spec converts the options, applying Istio's defaults for empty values: ports
// 15001/15006/15008, uid 1337, gid = uid, mark 1337, table 133, loopback 127.0.0.1/32.
// Every error names the option and quotes the value.
func (o Options) Spec() (Spec, error) {
	s := DefaultSpec()
	var errs []error
	field := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	port := func(name, v string, dst *uint16) {
		if strings.TrimSpace(v) == "" {
			return
		}
		p, err := ParsePort(v)
		field(name, err)
		*dst = p
	}
	port("proxy port", o.ProxyPort, &s.ProxyPort)
	port("inbound capture port", o.InboundCapturePort, &s.InboundCapturePort)
	port("inbound tunnel port", o.InboundTunnelPort, &s.InboundTunnelPort)

	if strings.TrimSpace(o.ProxyUID) != "" {
		ids, err := ParseIDList(o.ProxyUID)
		field("proxy uid", err)
		s.ProxyUIDs = ids
	}
	// The gid defaults to the uid, as in Istio. A bad uid is reported once, as a uid.
	if strings.TrimSpace(o.ProxyGID) != "" {
		ids, err := ParseIDList(o.ProxyGID)
		field("proxy gid", err)
		s.ProxyGIDs = ids
	} else if strings.TrimSpace(o.ProxyUID) != "" {
		s.ProxyGIDs = slices.Clone(s.ProxyUIDs)
	}
	var err error
	s.Mode, err = ParseMode(o.InboundInterceptionMode)
	field("interception mode", err)
	if v := strings.TrimSpace(o.InboundTProxyMark); v != "" {
		m, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			err = fmt.Errorf("%q is not a packet mark", v)
		}
		field("tproxy mark", err)
		s.TProxyMark = uint32(m)
	}
	if v := strings.TrimSpace(o.InboundTProxyRouteTable); v != "" {
		t, err := strconv.ParseUint(v, 10, 31)
		if err != nil {
			err = fmt.Errorf("%q is not a routing table number", v)
		}
		field("tproxy route table", err)
		s.TProxyRouteTable = int(t)
	}
	s.InboundPorts, err = ParsePortSet(o.InboundPortsInclude)
	field("inbound ports", err)
	s.InboundPortsExclude, err = ParsePortList(o.InboundPortsExclude)
	field("inbound ports exclude", err)
	s.OutboundCIDRs, err = ParsePrefixSet(o.OutboundIPRangesInclude)
	field("outbound CIDRs", err)
	if strings.TrimSpace(o.OutboundIPRangesExclude) == "*" {
		field("outbound CIDRs exclude", errors.New(`"*" is not allowed: it would exclude everything`))
	} else {
		s.OutboundCIDRsExclude, err = ParsePrefixList(o.OutboundIPRangesExclude)
		field("outbound CIDRs exclude", err)
	}
	s.OutboundPorts, err = ParsePortList(o.OutboundPortsInclude)
	field("outbound ports", err)
	s.OutboundPortsExclude, err = ParsePortList(o.OutboundPortsExclude)
	field("outbound ports exclude", err)
	s.RerouteVirtualInterfaces, err = ParseInterfaceList(o.RerouteVirtualInterfaces)
	field("reroute virtual interfaces", err)
	s.ExcludeInterfaces, err = ParseInterfaceList(o.ExcludeInterfaces)
	field("exclude interfaces", err)
	s.OwnerGroups, err = ParseGroupFilter(o.OwnerGroupsInclude, o.OwnerGroupsExclude)
	if err != nil {
		errs = append(errs, err) // it names its own fields: "owner groups include: ..."
	}
	if v := strings.TrimSpace(o.HostIPv4LoopbackCidr); v != "" {
		p, perr := parseLoopback(v)
		field("IPv4 loopback CIDR", perr)
		s.HostIPv4Loopback = p
	}
	s.DNS.Enabled = o.RedirectDNS
	s.DNS.CaptureAll = o.CaptureAllDNS
	s.DNS.Servers, err = ParseAddrList(o.DNSServers)
	field("DNS servers", err)
	s.DropInvalid = o.DropInvalid
	s.IPv6 = o.EnableIPv6
	if err := errors.Join(errs...); err != nil {
		return Spec{}, err
	}
	return s, s.Validate()
}
