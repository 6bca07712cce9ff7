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
	switch f {
	case FieldProxyPort:
		return parseUnlessBlank(&s.ProxyPort, v, ParsePort)
	case FieldInboundCapturePort:
		return parseUnlessBlank(&s.InboundCapturePort, v, ParsePort)
	case FieldInboundTunnelPort:
		return parseUnlessBlank(&s.InboundTunnelPort, v, ParsePort)
	case FieldProxyUIDs:
		return parseInto(&s.ProxyUIDs, v, ParseIDList)
	case FieldProxyGIDs:
		return parseInto(&s.ProxyGIDs, v, ParseIDList)
	case FieldMode:
		return parseInto(&s.Mode, v, ParseMode)
	case FieldTProxyMark:
		return parseUnlessBlank(&s.TProxyMark, v, ParseMark)
	case FieldTProxyRouteTable:
		return parseUnlessBlank(&s.TProxyRouteTable, v, ParseRouteTable)
	case FieldInboundPorts:
		return parseInto(&s.InboundPorts, v, ParsePortSet)
	case FieldInboundPortsExclude:
		return parseInto(&s.InboundPortsExclude, v, ParsePortList)
	case FieldOutboundCIDRs:
		return parseInto(&s.OutboundCIDRs, v, ParsePrefixSet)
	case FieldOutboundCIDRsExclude:
		if strings.TrimSpace(v) == "*" {
			return errors.New(`"*" is not allowed: it would exclude everything`)
		}
		return parseInto(&s.OutboundCIDRsExclude, v, ParsePrefixList)
	case FieldOutboundPorts:
		return parseInto(&s.OutboundPorts, v, ParsePortList)
	case FieldOutboundPortsExclude:
		return parseInto(&s.OutboundPortsExclude, v, ParsePortList)
	case FieldExcludeInterfaces:
		return parseInto(&s.ExcludeInterfaces, v, ParseInterfaceList)
	case FieldRerouteVirtualInterfaces:
		return parseInto(&s.RerouteVirtualInterfaces, v, ParseInterfaceList)
	case FieldOwnerGroupsInclude, FieldOwnerGroupsExclude:
		return s.setOwnerGroups(f, v)
	case FieldHostIPv4Loopback:
		return parseUnlessBlank(&s.HostIPv4Loopback, v, ParseLoopbackCIDR)
	case FieldDNSServers:
		return parseInto(&s.DNS.Servers, v, ParseAddrList)
	case FieldRedirectDNS:
		return parseInto(&s.DNS.Enabled, v, ParseBool)
	case FieldCaptureAllDNS:
		return parseInto(&s.DNS.CaptureAll, v, ParseBool)
	case FieldDropInvalid:
		return parseInto(&s.DropInvalid, v, ParseBool)
	case FieldIPv6:
		return parseInto(&s.IPv6, v, ParseBool)
	}
	return fmt.Errorf("unknown capture setting %d", f)
}

// parseInto parses v with parse into *dst, which a failure leaves unchanged.
func parseInto[T any](dst *T, v string, parse func(string) (T, error)) error {
	x, err := parse(v)
	if err != nil {
		return err
	}
	*dst = x
	return nil
}

// parseUnlessBlank is parseInto for a single-valued field: a blank v keeps *dst,
// Istio's default.
func parseUnlessBlank[T any](dst *T, v string, parse func(string) (T, error)) error {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	return parseInto(dst, v, parse)
}

// setOwnerGroups applies Istio's two owner group variables: an include list ("*"
// is every group, the default) or an exclude list, never both. As in Istio, an
// include list that names no group (empty, or only commas) captures no group, and
// an empty exclude list excludes none.
func (s *Spec) setOwnerGroups(f Field, v string) error {
	v = strings.TrimSpace(v)
	include := f == FieldOwnerGroupsInclude
	if !include && v == "" {
		return nil
	}
	other := s.OwnerGroups
	if include && v == "*" {
		if !other.Except {
			s.OwnerGroups = GroupFilter{Except: true} // every group
		}
		return nil
	}
	// An include list (Except false, even with no group) rules out an exclude list,
	// and an exclude list with groups rules out an include list.
	if include && other.Except && len(other.Groups) > 0 || !include && !other.Except {
		otherField := FieldOwnerGroupsInclude
		if other.Except {
			otherField = FieldOwnerGroupsExclude
		}
		hint := ""
		if len(other.Groups) == 0 {
			hint = " (set but empty: no group captured)"
		}
		return fmt.Errorf("cannot be combined with %s %s%s", otherField, Quote(strings.Join(other.Groups, ",")), hint)
	}
	groups, err := ParseGroupList(v)
	if err != nil {
		return err
	}
	if !include && len(groups) == 0 {
		return nil // only commas: no group excluded
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
