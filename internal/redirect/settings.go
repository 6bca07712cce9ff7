package redirect

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Field names one capture setting that Istio spells as a string: an istio-iptables
// flag or environment variable, or a pod annotation. Set parses such a string
// straight into its Spec field; nothing keeps the string form.
type Field uint8

// The fields, in the order istio-iptables lists its flags.
const (
	FieldProxyPort Field = iota + 1
	FieldInboundCapturePort
	FieldInboundTunnelPort
	FieldProxyUIDs
	FieldProxyGIDs
	FieldMode
	FieldTProxyMark
	FieldTProxyRouteTable
	FieldInboundPorts
	FieldInboundPortsExclude
	FieldExcludeInterfaces
	FieldOutboundCIDRs
	FieldOutboundCIDRsExclude
	FieldOutboundPorts
	FieldOutboundPortsExclude
	FieldRerouteVirtualInterfaces
	FieldOwnerGroupsInclude
	FieldOwnerGroupsExclude
	FieldHostIPv4Loopback
	FieldDNSServers
	FieldRedirectDNS
	FieldCaptureAllDNS
	FieldDropInvalid
	FieldIPv6
	fieldEnd
)

var fieldNames = [...]string{
	FieldProxyPort:                "proxy port",
	FieldInboundCapturePort:       "inbound capture port",
	FieldInboundTunnelPort:        "inbound tunnel port",
	FieldProxyUIDs:                "proxy uid",
	FieldProxyGIDs:                "proxy gid",
	FieldMode:                     "interception mode",
	FieldTProxyMark:               "tproxy mark",
	FieldTProxyRouteTable:         "tproxy route table",
	FieldInboundPorts:             "inbound ports",
	FieldInboundPortsExclude:      "inbound ports exclude",
	FieldExcludeInterfaces:        "exclude interfaces",
	FieldOutboundCIDRs:            "outbound CIDRs",
	FieldOutboundCIDRsExclude:     "outbound CIDRs exclude",
	FieldOutboundPorts:            "outbound ports",
	FieldOutboundPortsExclude:     "outbound ports exclude",
	FieldRerouteVirtualInterfaces: "reroute virtual interfaces",
	FieldOwnerGroupsInclude:       "owner groups include",
	FieldOwnerGroupsExclude:       "owner groups exclude",
	FieldHostIPv4Loopback:         "IPv4 loopback CIDR",
	FieldDNSServers:               "DNS servers",
	FieldRedirectDNS:              "redirect DNS",
	FieldCaptureAllDNS:            "capture all DNS",
	FieldDropInvalid:              "drop invalid",
	FieldIPv6:                     "IPv6",
}

// Fields lists every field, in order.
func Fields() []Field {
	out := make([]Field, 0, fieldEnd-1)
	for f := FieldProxyPort; f < fieldEnd; f++ {
		out = append(out, f)
	}
	return out
}

func (f Field) String() string {
	if f > 0 && f < fieldEnd {
		return fieldNames[f]
	}
	return "field " + strconv.Itoa(int(f))
}

// Set parses v, in the form Istio accepts for the field, into s. The error quotes the
// value and does not name the field: the caller names it the way its user wrote it
// (a flag, a variable, an annotation). For the single-valued fields (ports, mark,
// table, loopback) an empty or blank v keeps the current value, Istio's default; for
// lists an empty v sets the empty list. A failed Set leaves s unchanged. The result
// is checked as a whole by Validate, which Build calls.
func (s *Spec) Set(f Field, v string) error {
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%s is %d bytes, longer than the limit of %d", Quote(v), len(v), MaxValueBytes)
	}
	var err error
	switch f {
	case FieldProxyPort, FieldInboundCapturePort, FieldInboundTunnelPort:
		if strings.TrimSpace(v) == "" {
			return nil
		}
		p, err := ParsePort(v)
		if err != nil {
			return err
		}
		*map[Field]*uint16{FieldProxyPort: &s.ProxyPort, FieldInboundCapturePort: &s.InboundCapturePort,
			FieldInboundTunnelPort: &s.InboundTunnelPort}[f] = p
	case FieldProxyUIDs, FieldProxyGIDs:
		ids, err := ParseIDList(v)
		if err != nil {
			return err
		}
		if f == FieldProxyUIDs {
			s.ProxyUIDs = ids
		} else {
			s.ProxyGIDs = ids
		}
	case FieldMode:
		m, err := ParseMode(v)
		if err != nil {
			return err
		}
		s.Mode = m
	case FieldTProxyMark:
		if strings.TrimSpace(v) == "" {
			return nil
		}
		m, err := ParseMark(v)
		if err != nil {
			return err
		}
		s.TProxyMark = m
	case FieldTProxyRouteTable:
		if strings.TrimSpace(v) == "" {
			return nil
		}
		t, err := ParseRouteTable(v)
		if err != nil {
			return err
		}
		s.TProxyRouteTable = t
	case FieldInboundPorts:
		set, err := ParsePortSet(v)
		if err != nil {
			return err
		}
		s.InboundPorts = set
	case FieldOutboundCIDRs:
		set, err := ParsePrefixSet(v)
		if err != nil {
			return err
		}
		s.OutboundCIDRs = set
	case FieldOutboundCIDRsExclude:
		if strings.TrimSpace(v) == "*" {
			return errors.New(`"*" is not allowed: it would exclude everything`)
		}
		l, err := ParsePrefixList(v)
		if err != nil {
			return err
		}
		s.OutboundCIDRsExclude = l
	case FieldInboundPortsExclude, FieldOutboundPorts, FieldOutboundPortsExclude:
		l, err := ParsePortList(v)
		if err != nil {
			return err
		}
		*map[Field]*[]uint16{FieldInboundPortsExclude: &s.InboundPortsExclude, FieldOutboundPorts: &s.OutboundPorts,
			FieldOutboundPortsExclude: &s.OutboundPortsExclude}[f] = l
	case FieldExcludeInterfaces, FieldRerouteVirtualInterfaces:
		l, err := ParseInterfaceList(v)
		if err != nil {
			return err
		}
		if f == FieldExcludeInterfaces {
			s.ExcludeInterfaces = l
		} else {
			s.RerouteVirtualInterfaces = l
		}
	case FieldOwnerGroupsInclude, FieldOwnerGroupsExclude:
		return s.setOwnerGroups(f, v)
	case FieldHostIPv4Loopback:
		if strings.TrimSpace(v) == "" {
			return nil
		}
		p, err := ParseLoopbackCIDR(v)
		if err != nil {
			return err
		}
		s.HostIPv4Loopback = p
	case FieldDNSServers:
		items, err := splitLimited(v)
		if err != nil {
			return err
		}
		l, err := ParseAddrList(items)
		if err != nil {
			return err
		}
		s.DNS.Servers = l
	case FieldRedirectDNS, FieldCaptureAllDNS, FieldDropInvalid, FieldIPv6:
		b, err := ParseBool(v)
		if err != nil {
			return err
		}
		*map[Field]*bool{FieldRedirectDNS: &s.DNS.Enabled, FieldCaptureAllDNS: &s.DNS.CaptureAll,
			FieldDropInvalid: &s.DropInvalid, FieldIPv6: &s.IPv6}[f] = b
	default:
		err = fmt.Errorf("unknown capture setting %d", f)
	}
	return err
}

// setOwnerGroups applies Istio's two owner group variables: an include list ("*",
// the default, is every group) or an exclude list, never both.
func (s *Spec) setOwnerGroups(f Field, v string) error {
	v = strings.TrimSpace(v)
	include := f == FieldOwnerGroupsInclude
	if !include && v == "" {
		return nil
	}
	if include && (v == "" || v == "*") {
		if !s.OwnerGroups.Except {
			s.OwnerGroups = GroupFilter{Except: true} // every group
		}
		return nil
	}
	if other := s.OwnerGroups; len(other.Groups) > 0 && other.Except == include {
		otherField := FieldOwnerGroupsInclude
		if other.Except {
			otherField = FieldOwnerGroupsExclude
		}
		return fmt.Errorf("cannot be combined with %s %s", otherField, Quote(strings.Join(other.Groups, ",")))
	}
	groups, err := ParseGroupList(v)
	if err != nil {
		return err
	}
	if len(groups) == 0 {
		s.OwnerGroups = GroupFilter{Except: true} // every group
		return nil
	}
	s.OwnerGroups = GroupFilter{Except: !include, Groups: groups}
	return nil
}

// ParseMark parses a packet mark, 1-4294967295.
func ParseMark(v string) (uint32, error) {
	s := strings.TrimSpace(v)
	m, err := strconv.ParseUint(s, 10, 32)
	if err != nil || m == 0 || !isDigits(s) {
		return 0, fmt.Errorf("%s is not a packet mark (1-4294967295)", Quote(v))
	}
	return uint32(m), nil
}

// ParseRouteTable parses a routing table number that policy routing can use: 1-252
// or above 255 (253-255 are the kernel's default, main and local tables).
func ParseRouteTable(v string) (int, error) {
	s := strings.TrimSpace(v)
	t, err := strconv.ParseUint(s, 10, 31)
	if err != nil || t == 0 || t >= 253 && t <= 255 || !isDigits(s) {
		return 0, fmt.Errorf("%s is not a usable routing table (1-252 or above 255)", Quote(v))
	}
	return int(t), nil
}

// ParseBool parses a boolean in strconv's forms.
func ParseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%s is not a boolean (true or false)", Quote(v))
	}
	return b, nil
}

// Limits on what comes from outside (pod annotations, flags, variables): far above
// what a real pod uses, far below what would hurt a node. One pod's annotation may
// carry 256 KiB; without limits 44,517 excluded ports became 89,000 rules.
const (
	// MaxValueBytes bounds one setting's string form.
	MaxValueBytes = 16 << 10
	// MaxListItems bounds each list (ports, CIDRs, interfaces, DNS servers, uids).
	MaxListItems = 256
	// MaxSpecItems bounds the sum of all lists of one spec.
	MaxSpecItems = 1024
)

// quoteLimit is how much of a value Quote shows before it cuts.
const quoteLimit = 48

// Quote quotes a value for an error or a log line; a long one is cut to its first
// bytes and its length, so that a hostile 1 MiB annotation is not echoed whole.
func Quote(v string) string {
	if len(v) <= quoteLimit {
		return strconv.Quote(v)
	}
	cut := quoteLimit
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(v[:cut]), len(v))
}
