package plugin

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Istio's plugin checks each traffic annotation before it uses it
// (cni/pkg/plugin/sidecar_redirect.go, getAnnotationOrDefault) and fails the ADD on
// a value its check refuses. The parsers in internal/redirect also read the
// istio-iptables command's flags, which Istio reads more leniently (items trimmed,
// empty items dropped, a bare address taken as a host), so a pod's annotation is
// held here to Istio's plugin's checks as well: a value it refuses fails the ADD
// rather than being given a meaning.
//
// These checks run only on a value the shared parser accepted, so a value both
// refuse keeps the parser's message; and they refuse nothing on which Istio's
// plugin succeeds (a blank port list passes its check, then fails its ADD in
// iptables-restore, so it is refused here), so what an accepted value means is
// still the parser's reading. The parser itself refuses two ports Istio's plugin
// takes: 0 (a rule that matches nothing) and a leading zero (read as decimal by its
// check, as octal by its rule).

// checkInterceptionMode is Istio's validateInterceptionMode: REDIRECT or TPROXY
// exactly, so neither an empty value nor one with spaces.
func checkInterceptionMode(v string) error {
	switch v {
	case "REDIRECT", "TPROXY":
		return nil
	case "":
		return fmt.Errorf(`"" is not an interception mode: Istio's plugin takes exactly REDIRECT or TPROXY (without the annotation the mode is REDIRECT)`)
	}
	return fmt.Errorf("%s is not an interception mode: Istio's plugin takes exactly REDIRECT or TPROXY", redirect.Quote(v))
}

// checkPortList is Istio's validatePortListWithWildcard: "*" alone, or a list that,
// trimmed as a whole, is empty or has a number in every item (each item trimmed).
// So an empty item ("80,,443", "80,") is refused, and so is a wildcard with spaces.
func checkPortList(v string) error {
	trimmed := strings.TrimSpace(v)
	switch {
	case v == "*" || trimmed == "":
		return nil
	case trimmed == "*":
		return errSpacedWildcard(v)
	}
	for _, item := range strings.Split(trimmed, ",") {
		if strings.TrimSpace(item) == "" {
			return errEmptyItem(v)
		}
	}
	return nil
}

// checkPortListUntrimmed is checkPortList for the port annotations Istio's plugin
// passes on to its rules untrimmed (includeInboundPorts, includeOutboundPorts,
// excludeOutboundPorts; it trims excludeInboundPorts): a value of spaces alone
// passes Istio's check, then its rules name no port and iptables-restore fails the
// ADD. It is refused here, before any rule; "" means no ports, as there.
func checkPortListUntrimmed(v string) error {
	if v != "" && strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s is blank: Istio's plugin fails the ADD on it (its rule names no port); an empty value means no ports", redirect.Quote(v))
	}
	return checkPortList(v)
}

// checkCIDRList is Istio's validateCIDRListWithWildcard and validateCIDRList: "*"
// alone, "", or items split at commas, each of which netip.ParsePrefix accepts as
// it is, untrimmed. So an address without a prefix length, an item with spaces
// around it ("10.0.0.0/8, 192.168.0.0/16") and an empty item are refused.
func checkCIDRList(v string) error {
	if v == "*" || v == "" {
		return nil
	}
	switch strings.TrimSpace(v) {
	case "*":
		return errSpacedWildcard(v)
	case "":
		return fmt.Errorf("%s is blank: Istio's plugin refuses it (an empty value means no ranges)", redirect.Quote(v))
	}
	for _, item := range strings.Split(v, ",") {
		if _, err := netip.ParsePrefix(item); err == nil {
			continue
		}
		trimmed := strings.TrimSpace(item)
		if trimmed == "" {
			return errEmptyItem(v)
		}
		if trimmed != item {
			return fmt.Errorf("%s has spaces around %s: Istio's plugin does not trim list items, so it refuses them",
				redirect.Quote(v), redirect.Quote(trimmed))
		}
		if a, err := netip.ParseAddr(item); err == nil {
			return fmt.Errorf("%s has no prefix length: Istio's plugin takes only CIDRs (for this address alone, %s)",
				redirect.Quote(item), redirect.Quote(netip.PrefixFrom(a, a.BitLen()).String()))
		}
		return fmt.Errorf("%s is not a CIDR", redirect.Quote(item))
	}
	return nil
}

// checkInterfaceList is Istio's ValidateInterfaceNames (pkg/util/net), which its
// plugin makes of excludeInterfaces, reroute-virtual-interfaces and the deprecated
// kubevirtInterfaces: "", or names split at commas, each trimmed, that start with a
// letter and hold only letters, digits, _, . and - (at most 15, which the parser
// checks). So a blank value, an empty item ("eth0,,eth1", "eth0,") and a name Linux
// takes that Istio's check does not ("1eth", "_x", "veth@1") are refused.
func checkInterfaceList(v string) error {
	if v == "" {
		return nil
	}
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s is blank: Istio's plugin refuses it (an empty value means no interfaces)", redirect.Quote(v))
	}
	for _, item := range strings.Split(v, ",") {
		name := strings.TrimSpace(item)
		if name == "" {
			return errEmptyItem(v)
		}
		if !istioInterfaceName(name) {
			return fmt.Errorf("%s is not an interface name Istio's plugin takes (a letter first, then letters, digits, _, . and -)", redirect.Quote(name))
		}
	}
	return nil
}

// istioInterfaceName is Istio's pattern of an interface name, ^[a-zA-Z][a-zA-Z0-9_.\-]*$.
func istioInterfaceName(name string) bool {
	for i, c := range name {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-')) {
			return false
		}
	}
	return name != ""
}

func errSpacedWildcard(v string) error {
	return fmt.Errorf(`%s is not the wildcard: Istio's plugin takes "*" only without spaces`, redirect.Quote(v))
}

func errEmptyItem(v string) error {
	return fmt.Errorf("%s has an empty item: Istio's plugin refuses it", redirect.Quote(v))
}
