package redirect

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// These parsers turn Istio's comma-separated option strings (flags, environment
// variables, pod annotations) into typed values. They accept what Istio accepts
// (surrounding spaces, empty items) and reject anything else with an error that
// quotes the offending item. Pod authors control annotations, so nothing that passes
// here is ever pasted into a command line unchecked. Istio's istio-iptables reads its
// flags this leniently; its CNI plugin checks pod annotations more strictly, and
// internal/plugin adds those checks for annotations.

// splitList splits a comma-separated list, trimming spaces and dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// splitLimited is splitList for the lists that have a size limit: more than
// MaxListItems items is an error that says how many.
func splitLimited(s string) ([]string, error) {
	items := splitList(s)
	if len(items) > MaxListItems {
		return nil, fmt.Errorf("%d items given, at most %d are supported", len(items), MaxListItems)
	}
	return items, nil
}

// parseList parses each item of a comma-separated list of at most MaxListItems.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	items, err := splitLimited(s)
	if err != nil {
		return nil, err
	}
	var out []T
	for _, item := range items {
		v, err := parse(item)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// ParsePort parses one TCP/UDP port, 1-65535, in decimal. A leading zero is
// refused: Istio's check reads "010" as 10, but the iptables rule it writes reads
// it as octal (port 8, and "08" fails the rule), so the value has no one meaning.
func ParsePort(s string) (uint16, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || !isDigits(s) {
		return 0, fmt.Errorf("%s is not a port (1-65535)", Quote(s))
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("%s is not a port: it has a leading zero, which iptables reads as octal (write %d, or the octal value's port)", Quote(s), n)
	}
	return uint16(n), nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ParsePortList parses "80,443"; duplicates are dropped, order is kept.
func ParsePortList(s string) ([]uint16, error) {
	ports, err := parseList(s, ParsePort)
	if err != nil {
		return nil, err
	}
	seen := map[uint16]bool{}
	return slices.DeleteFunc(ports, func(p uint16) bool {
		dup := seen[p]
		seen[p] = true
		return dup
	}), nil
}

// ParsePortSet parses "*" or a port list.
func ParsePortSet(s string) (PortSet, error) {
	all, ports, err := parseAllOr(s, ParsePortList)
	return PortSet{All: all, Ports: ports}, err
}

// parseAllOr parses "*" (all) or else a list.
func parseAllOr[T any](s string, parseList func(string) ([]T, error)) (all bool, list []T, err error) {
	if strings.TrimSpace(s) == "*" {
		return true, nil, nil
	}
	list, err = parseList(s)
	return false, list, err
}

// ParsePrefix parses a CIDR or a bare address (taken as a host route) and returns it
// in canonical (masked) form.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%s is not a CIDR", Quote(s))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%s is not an IP address or CIDR", Quote(s))
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ParsePrefixList parses "10.0.0.0/8,fd00::/8".
func ParsePrefixList(s string) ([]netip.Prefix, error) { return parseList(s, ParsePrefix) }

// ParsePrefixSet parses "*" or a CIDR list.
func ParsePrefixSet(s string) (PrefixSet, error) {
	all, prefixes, err := parseAllOr(s, ParsePrefixList)
	return PrefixSet{All: all, Prefixes: prefixes}, err
}

// ParseID parses a numeric uid or gid. 4294967295 is (uid_t)-1, which no process
// has and which iptables' owner match refuses.
func ParseID(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || !isDigits(s) {
		return 0, fmt.Errorf("%s is not a numeric user or group id", Quote(s))
	}
	if n == InvalidID {
		return 0, fmt.Errorf("%s is not a usable user or group id: it is (uid_t)-1", Quote(s))
	}
	return uint32(n), nil
}

// InvalidID is (uid_t)-1 and (gid_t)-1.
const InvalidID = 1<<32 - 1

// ParseIDList parses "1337,1338".
func ParseIDList(s string) ([]uint32, error) { return parseList(s, ParseID) }

// ValidateInterfaceName accepts a network interface name the kernel accepts (1-15
// bytes, not "." or "..") and that is safe in any rule syntax: letters, digits and
// "._-@" only, not starting with '-'. Pod authors set these names, so characters that
// mean something to a shell, to iptables ('+' widens a match, '!' negates) or to nft
// are refused, even where the kernel would allow them.
func ValidateInterfaceName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return fmt.Errorf("%s is not an interface name (1-15 characters)", Quote(name))
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '.' || c == '@' || c == '-' && i > 0
		if !ok {
			return fmt.Errorf("%s is not an interface name (character %q not allowed)", Quote(name), c)
		}
	}
	return nil
}

// ParseInterfaceList parses "eth1,net1".
func ParseInterfaceList(s string) ([]string, error) {
	return parseList(s, func(name string) (string, error) { return name, ValidateInterfaceName(name) })
}

// ValidateGroup accepts a numeric gid or a POSIX group name. The group goes into rules
// as written, and iptables reads a number with a leading zero as octal, so "010" is
// refused rather than meaning 8 to iptables and 10 to everything else.
func ValidateGroup(g string) error {
	if isDigits(g) {
		if _, err := ParseID(g); err != nil {
			return err
		}
		if len(g) > 1 && g[0] == '0' {
			return fmt.Errorf("%s is not a group id (iptables reads a leading zero as octal)", Quote(g))
		}
		return nil
	}
	if g == "" || len(g) > 32 {
		return fmt.Errorf("%s is not a group name or id", Quote(g))
	}
	for i, c := range g {
		ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
			i > 0 && (c >= '0' && c <= '9' || c == '-' || c == '.' || c == '$' && i == len(g)-1)
		if !ok {
			return fmt.Errorf("%s is not a group name or id", Quote(g))
		}
	}
	return nil
}

// ParseGroupList parses a comma-separated list of groups, at most MaxOwnerGroups.
func ParseGroupList(s string) ([]string, error) {
	groups := splitList(s)
	if len(groups) > MaxOwnerGroups {
		return nil, fmt.Errorf("%d groups given, at most %d are supported", len(groups), MaxOwnerGroups)
	}
	for _, g := range groups {
		if err := ValidateGroup(g); err != nil {
			return nil, err
		}
	}
	return groups, nil
}

// ParseMode parses an interception mode. Empty means REDIRECT, as in Istio.
func ParseMode(s string) (Mode, error) {
	switch strings.TrimSpace(s) {
	case "", "REDIRECT":
		return ModeRedirect, nil
	case "TPROXY":
		return ModeTProxy, nil
	}
	return 0, fmt.Errorf("%s is not an interception mode (REDIRECT or TPROXY)", Quote(s))
}

// ParseAddrList parses "10.96.0.10,fd00::10": plain IP addresses (DNS servers).
func ParseAddrList(s string) ([]netip.Addr, error) {
	return parseList(s, func(item string) (netip.Addr, error) {
		a, err := netip.ParseAddr(item)
		if err != nil || a.Zone() != "" {
			return netip.Addr{}, fmt.Errorf("%s is not an IP address", Quote(item))
		}
		return a.Unmap(), nil
	})
}

// ParseLoopbackCIDR parses the IPv4 loopback CIDR. Unlike other CIDRs it is kept as
// given (Istio writes "127.0.0.1/8" into its rules as is).
func ParseLoopbackCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || !p.Addr().Is4() || !p.Addr().IsLoopback() || p.Bits() < 8 {
		return netip.Prefix{}, fmt.Errorf("%s is not an IPv4 loopback CIDR within 127.0.0.0/8", Quote(s))
	}
	return p, nil
}
