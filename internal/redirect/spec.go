package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Mode is how inbound traffic reaches the proxy.
type Mode uint8

const (
	// ModeRedirect uses NAT REDIRECT (Istio's default).
	ModeRedirect Mode = iota
	// ModeTProxy uses TPROXY with a packet mark and policy routing, preserving the
	// original source address.
	ModeTProxy
)

func (m Mode) String() string {
	if m == ModeTProxy {
		return "TPROXY"
	}
	return "REDIRECT"
}

// PortSet is a set of ports, or all ports ("*").
type PortSet struct {
	All   bool
	Ports []uint16
}

// Empty reports whether the set selects nothing.
func (s PortSet) Empty() bool { return !s.All && len(s.Ports) == 0 }

// PrefixSet is a set of CIDRs, or every address ("*").
type PrefixSet struct {
	All      bool
	Prefixes []netip.Prefix
}

// GroupFilter selects outbound traffic by the sending process's group, as Istio's
// InterceptFilter. Every group is {Except: true} with no groups (DefaultSpec's);
// {Except: false} with no groups captures no group's traffic at all, which is what
// Istio makes of a set but empty ISTIO_OUTBOUND_OWNER_GROUPS.
type GroupFilter struct {
	// Except: when true, Groups are the groups NOT captured; when false, only Groups
	// are captured (none when Groups is empty).
	Except bool
	Groups []string
}

// DNS configures capture of DNS to the agent.
type DNS struct {
	Enabled bool
	// CaptureAll redirects every DNS query, whatever its server.
	CaptureAll bool
	// Servers are the resolvers whose queries are captured when CaptureAll is off.
	Servers []netip.Addr
}

// Spec is the validated input of the builder: every option of Istio's sidecar capture.
// Build it with DefaultSpec and change fields, then call Validate (Build does).
type Spec struct {
	ProxyPort          uint16 // outbound capture, 15001
	InboundCapturePort uint16 // inbound capture, 15006
	InboundTunnelPort  uint16 // HBONE tunnel, 15008, never captured
	DNSPort            uint16 // the agent's DNS listener, 15053

	ProxyUIDs []uint32
	ProxyGIDs []uint32

	Mode             Mode
	TProxyMark       uint32 // 1337
	TProxyRouteTable int    // 133

	InboundPorts        PortSet  // "*" captures all
	InboundPortsExclude []uint16 // honoured only with InboundPorts.All, as in Istio

	OutboundCIDRs        PrefixSet
	OutboundCIDRsExclude []netip.Prefix
	OutboundPorts        []uint16
	OutboundPortsExclude []uint16

	ExcludeInterfaces        []string
	RerouteVirtualInterfaces []string

	OwnerGroups GroupFilter

	DNS DNS

	DropInvalid bool

	// HostIPv4Loopback is the IPv4 loopback range treated as local, 127.0.0.1/32 by default.
	HostIPv4Loopback netip.Prefix

	// IPv6 enables the ip6 family of rules.
	IPv6 bool
}

// Well-known values shared with Istio.
const (
	DefaultProxyPort          = 15001
	DefaultInboundCapturePort = 15006
	DefaultInboundTunnelPort  = 15008
	DefaultDNSPort            = 15053
	DefaultProxyUID           = 1337
	DefaultTProxyMark         = 1337
	DefaultTProxyRouteTable   = 133
	// OutboundMark marks proxy-to-app traffic in TPROXY mode.
	OutboundMark = 1338
	// MaxOwnerGroups bounds the owner group filter, as Istio does.
	MaxOwnerGroups = 64
)

var (
	// InboundPassthroughV4 and V6 are the addresses the proxy binds for inbound passthrough.
	InboundPassthroughV4 = netip.MustParsePrefix("127.0.0.6/32")
	InboundPassthroughV6 = netip.MustParsePrefix("::6/128")
	// LoopbackV6 is IPv6's loopback.
	LoopbackV6 = netip.MustParsePrefix("::1/128")
)

// DefaultSpec returns the spec of Istio's sidecar capture with nothing captured yet:
// the fixed ports, the default proxy identity and the IPv4 loopback.
func DefaultSpec() Spec {
	return Spec{
		ProxyPort:          DefaultProxyPort,
		InboundCapturePort: DefaultInboundCapturePort,
		InboundTunnelPort:  DefaultInboundTunnelPort,
		DNSPort:            DefaultDNSPort,
		ProxyUIDs:          []uint32{DefaultProxyUID},
		ProxyGIDs:          []uint32{DefaultProxyUID},
		TProxyMark:         DefaultTProxyMark,
		TProxyRouteTable:   DefaultTProxyRouteTable,
		HostIPv4Loopback:   netip.MustParsePrefix("127.0.0.1/32"),
		OwnerGroups:        GroupFilter{Except: true}, // every group
	}
}

// NeedsTProxyRouting says whether the capture needs TPROXY's policy routing (the
// fwmark rule and the local route of its table): only when inbound traffic is
// TPROXY-captured at all, as in Istio, which adds them only in TPROXY mode with
// inbound ports to capture. Build decides with it; nothing else decides routing.
func (s *Spec) NeedsTProxyRouting() bool {
	return s.Mode == ModeTProxy && !s.InboundPorts.Empty()
}

// listFields are the fields that hold lists, whose items MaxListItems bounds each
// and MaxSpecItems all together.
var listFields = []Field{
	FieldProxyUIDs, FieldProxyGIDs, FieldInboundPorts, FieldInboundPortsExclude,
	FieldOutboundCIDRs, FieldOutboundCIDRsExclude, FieldOutboundPorts, FieldOutboundPortsExclude,
	FieldExcludeInterfaces, FieldRerouteVirtualInterfaces, FieldDNSServers,
}

// ListItems is how many items field f holds, as MaxListItems and MaxSpecItems
// count them: 0 for a field that is not a list ("*" included).
func (s *Spec) ListItems(f Field) int {
	switch f {
	case FieldProxyUIDs:
		return len(s.ProxyUIDs)
	case FieldProxyGIDs:
		return len(s.ProxyGIDs)
	case FieldInboundPorts:
		return len(s.InboundPorts.Ports)
	case FieldInboundPortsExclude:
		return len(s.InboundPortsExclude)
	case FieldOutboundCIDRs:
		return len(s.OutboundCIDRs.Prefixes)
	case FieldOutboundCIDRsExclude:
		return len(s.OutboundCIDRsExclude)
	case FieldOutboundPorts:
		return len(s.OutboundPorts)
	case FieldOutboundPortsExclude:
		return len(s.OutboundPortsExclude)
	case FieldExcludeInterfaces:
		return len(s.ExcludeInterfaces)
	case FieldRerouteVirtualInterfaces:
		return len(s.RerouteVirtualInterfaces)
	case FieldDNSServers:
		return len(s.DNS.Servers)
	}
	return 0
}

// ItemsError is Validate's refusal of a spec whose lists hold more than
// MaxSpecItems items in all, no one list over its own limit needed: a caller that
// knows where the items came from (the plugin: which annotations) names them.
type ItemsError struct {
	Total int
}

func (e *ItemsError) Error() string {
	return fmt.Sprintf("capture: %d ports, CIDRs, interfaces, ids and servers in all, at most %d are supported", e.Total, MaxSpecItems)
}

// Validate checks the spec's invariants. It names the field and the value at fault.
func (s *Spec) Validate() error {
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	for _, p := range []struct {
		field string
		port  uint16
	}{
		{"proxy port", s.ProxyPort}, {"inbound capture port", s.InboundCapturePort},
		{"inbound tunnel port", s.InboundTunnelPort}, {"DNS port", s.DNSPort},
	} {
		if p.port == 0 {
			bad(p.field, "must be 1-65535, got 0")
		}
	}
	if len(s.ProxyUIDs) == 0 {
		bad("proxy uid", "at least one uid is required")
	}
	if len(s.ProxyGIDs) == 0 {
		bad("proxy gid", "at least one gid is required")
	}
	if slices.Contains(s.ProxyUIDs, InvalidID) {
		bad("proxy uid", "%d is (uid_t)-1, not a user", uint32(InvalidID))
	}
	if slices.Contains(s.ProxyGIDs, InvalidID) {
		bad("proxy gid", "%d is (gid_t)-1, not a group", uint32(InvalidID))
	}
	if s.Mode != ModeRedirect && s.Mode != ModeTProxy {
		bad("interception mode", "unknown mode %d", s.Mode)
	}
	if s.Mode == ModeTProxy {
		if s.TProxyMark == 0 {
			bad("tproxy mark", "must be non-zero")
		}
		if s.TProxyRouteTable <= 0 || s.TProxyRouteTable >= 253 && s.TProxyRouteTable <= 255 {
			bad("tproxy route table", "%d is not a usable routing table (1-252 or above 255)", s.TProxyRouteTable)
		}
	}
	if s.InboundPorts.All && len(s.InboundPorts.Ports) > 0 {
		bad("inbound ports", "'*' cannot be combined with a port list")
	}
	if s.OutboundCIDRs.All && len(s.OutboundCIDRs.Prefixes) > 0 {
		bad("outbound CIDRs", "'*' cannot be combined with a CIDR list")
	}
	for _, set := range []struct {
		field string
		ports []uint16
	}{
		{"inbound ports", s.InboundPorts.Ports}, {"inbound ports exclude", s.InboundPortsExclude},
		{"outbound ports", s.OutboundPorts}, {"outbound ports exclude", s.OutboundPortsExclude},
	} {
		if slices.Contains(set.ports, 0) {
			bad(set.field, "port 0 is not a port")
		}
	}
	for _, set := range []struct {
		field    string
		prefixes []netip.Prefix
	}{{"outbound CIDRs", s.OutboundCIDRs.Prefixes}, {"outbound CIDRs exclude", s.OutboundCIDRsExclude}} {
		for _, p := range set.prefixes {
			if !p.IsValid() || p != p.Masked() {
				bad(set.field, "%q is not a canonical CIDR", p)
			}
		}
	}
	for _, set := range []struct {
		field  string
		ifaces []string
	}{{"exclude interfaces", s.ExcludeInterfaces}, {"reroute virtual interfaces", s.RerouteVirtualInterfaces}} {
		for _, name := range set.ifaces {
			if err := ValidateInterfaceName(name); err != nil {
				bad(set.field, "%v", err)
			}
		}
	}
	total := 0
	for _, f := range listFields {
		n := s.ListItems(f)
		if n > MaxListItems {
			bad(f.String(), "%d items given, at most %d are supported", n, MaxListItems)
		}
		total += n
	}
	if total > MaxSpecItems {
		errs = append(errs, &ItemsError{Total: total})
	}
	if len(s.OwnerGroups.Groups) > MaxOwnerGroups {
		bad("owner groups", "%d groups given, at most %d are supported", len(s.OwnerGroups.Groups), MaxOwnerGroups)
	}
	for _, g := range s.OwnerGroups.Groups {
		if err := ValidateGroup(g); err != nil {
			bad("owner groups", "%v", err)
		}
	}
	for _, a := range s.DNS.Servers {
		if !a.IsValid() || a.Zone() != "" {
			bad("DNS servers", "%q is not a plain IP address", a)
		}
	}
	if !s.HostIPv4Loopback.IsValid() || !s.HostIPv4Loopback.Addr().Is4() || !s.HostIPv4Loopback.Addr().IsLoopback() {
		bad("IPv4 loopback CIDR", "%q is not an IPv4 loopback CIDR (127.0.0.0/8)", s.HostIPv4Loopback)
	} else if s.HostIPv4Loopback.Bits() < 8 {
		bad("IPv4 loopback CIDR", "%q is wider than 127.0.0.0/8", s.HostIPv4Loopback)
	}
	return errors.Join(errs...)
}
