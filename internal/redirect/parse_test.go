package redirect

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// TestOptionsSpecAcceptsIstioInputs: every option, in the forms Istio accepts, becomes
// the typed value. Each case changes DefaultSpec as expected.
func TestOptionsSpecAcceptsIstioInputs(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want func(s *Spec)
	}{
		{"empty options are Istio's defaults", Options{}, func(s *Spec) {}},
		{"proxy port", Options{ProxyPort: "15101"}, func(s *Spec) { s.ProxyPort = 15101 }},
		{"proxy port with spaces", Options{ProxyPort: " 15101 "}, func(s *Spec) { s.ProxyPort = 15101 }},
		{"inbound capture port", Options{InboundCapturePort: "15106"}, func(s *Spec) { s.InboundCapturePort = 15106 }},
		{"inbound tunnel port", Options{InboundTunnelPort: "65535"}, func(s *Spec) { s.InboundTunnelPort = 65535 }},
		{"proxy uids; gids default to them", Options{ProxyUID: "3,4"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{3, 4}, []uint32{3, 4} }},
		{"proxy uid and gid apart", Options{ProxyUID: "3", ProxyGID: " 5 ,"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{3}, []uint32{5} }},
		{"proxy gid alone", Options{ProxyGID: "5"}, func(s *Spec) { s.ProxyGIDs = []uint32{5} }},
		{"uid 0 and the largest uid", Options{ProxyUID: "0,4294967294"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{0, 4294967294}, []uint32{0, 4294967294} }},
		{"mode REDIRECT", Options{InboundInterceptionMode: "REDIRECT"}, func(s *Spec) {}},
		{"mode TPROXY", Options{InboundInterceptionMode: "TPROXY"}, func(s *Spec) { s.Mode = ModeTProxy }},
		{"tproxy mark and table", Options{InboundInterceptionMode: "TPROXY", InboundTProxyMark: "7", InboundTProxyRouteTable: "200"}, func(s *Spec) { s.Mode, s.TProxyMark, s.TProxyRouteTable = ModeTProxy, 7, 200 }},
		{"tproxy mark 0 is harmless in REDIRECT mode", Options{InboundTProxyMark: "0"}, func(s *Spec) { s.TProxyMark = 0 }},
		{"inbound ports *", Options{InboundPortsInclude: "*"}, func(s *Spec) { s.InboundPorts = PortSet{All: true} }},
		{"inbound ports * with spaces", Options{InboundPortsInclude: " * "}, func(s *Spec) { s.InboundPorts = PortSet{All: true} }},
		{"inbound ports list", Options{InboundPortsInclude: "80, 443"}, func(s *Spec) { s.InboundPorts = PortSet{Ports: []uint16{80, 443}} }},
		{"inbound ports exclude with a trailing comma", Options{InboundPortsInclude: "*", InboundPortsExclude: "6000,7000,"}, func(s *Spec) {
			s.InboundPorts, s.InboundPortsExclude = PortSet{All: true}, []uint16{6000, 7000}
		}},
		{"duplicate ports are dropped, order kept", Options{InboundPortsExclude: "7000,6000,7000"}, func(s *Spec) { s.InboundPortsExclude = []uint16{7000, 6000} }},
		{"empty items are dropped", Options{OutboundPortsInclude: ",, 80 ,,"}, func(s *Spec) { s.OutboundPorts = []uint16{80} }},
		{"outbound CIDRs *", Options{OutboundIPRangesInclude: "*"}, func(s *Spec) { s.OutboundCIDRs = PrefixSet{All: true} }},
		{"outbound CIDRs are masked", Options{OutboundIPRangesInclude: "10.0.0.1/8, fd00::1/64"}, func(s *Spec) { s.OutboundCIDRs.Prefixes = prefixes("10.0.0.0/8", "fd00::/64") }},
		{"bare addresses are host routes", Options{OutboundIPRangesInclude: "10.1.2.3,fd00::1"}, func(s *Spec) { s.OutboundCIDRs.Prefixes = prefixes("10.1.2.3/32", "fd00::1/128") }},
		{"a mapped IPv4 address is IPv4", Options{OutboundIPRangesExclude: "::ffff:10.1.2.3"}, func(s *Spec) { s.OutboundCIDRsExclude = prefixes("10.1.2.3/32") }},
		{"outbound CIDRs exclude", Options{OutboundIPRangesExclude: "169.254.169.254,10.0.0.0/24,"}, func(s *Spec) { s.OutboundCIDRsExclude = prefixes("169.254.169.254/32", "10.0.0.0/24") }},
		{"outbound ports exclude", Options{OutboundPortsExclude: "6379"}, func(s *Spec) { s.OutboundPortsExclude = []uint16{6379} }},
		{"interfaces", Options{ExcludeInterfaces: "net1, eth0.100,", RerouteVirtualInterfaces: "br-ab_1"}, func(s *Spec) {
			s.ExcludeInterfaces, s.RerouteVirtualInterfaces = []string{"net1", "eth0.100"}, []string{"br-ab_1"}
		}},
		{"a 15-character interface name", Options{ExcludeInterfaces: "abcdefghijklmno"}, func(s *Spec) { s.ExcludeInterfaces = []string{"abcdefghijklmno"} }},
		{"owner groups include", Options{OwnerGroupsInclude: "java, 202"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Groups: []string{"java", "202"}} }},
		{"owner groups include * is every group", Options{OwnerGroupsInclude: "*"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true} }},
		{"owner groups exclude", Options{OwnerGroupsExclude: "888,ftp,"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"888", "ftp"}} }},
		{"owner groups include * and an exclude list", Options{OwnerGroupsInclude: "*", OwnerGroupsExclude: "888"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"888"}} }},
		{"a machine account group name", Options{OwnerGroupsExclude: "host$"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"host$"}} }},
		{"loopback CIDR is kept as given", Options{HostIPv4LoopbackCidr: "127.0.0.1/8"}, func(s *Spec) { s.HostIPv4Loopback = netip.MustParsePrefix("127.0.0.1/8") }},
		{"DNS", Options{RedirectDNS: true, CaptureAllDNS: true, DNSServers: []string{" 10.96.0.10 ", "fd00::a", "::ffff:1.1.1.1"}}, func(s *Spec) {
			s.DNS = DNS{Enabled: true, CaptureAll: true, Servers: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::a"), netip.MustParseAddr("1.1.1.1")}}
		}},
		{"drop invalid and IPv6", Options{DropInvalid: true, EnableIPv6: true}, func(s *Spec) { s.DropInvalid, s.IPv6 = true, true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.opts.Spec()
			if err != nil {
				t.Fatalf("Spec(): %v", err)
			}
			want := DefaultSpec()
			// Options always spell "every group" as an empty exception list.
			want.OwnerGroups.Except = true
			tt.want(&want)
			if diff := cmp.Diff(want, got, cmpPlan); diff != "" {
				t.Errorf("Spec() (-want +got):\n%s", diff)
			}
			if _, err := Build(got); err != nil {
				t.Errorf("Build: %v", err)
			}
		})
	}
}

// TestOptionsSpecRejectsBadInputs: each error names the option and quotes the value, so
// a pod author can find the annotation at fault.
func TestOptionsSpecRejectsBadInputs(t *testing.T) {
	long := strings.Repeat("g,", MaxOwnerGroups) + "g"
	tests := []struct {
		name    string
		opts    Options
		wantErr []string
		notErr  string
	}{
		{"proxy port 0", Options{ProxyPort: "0"}, []string{`proxy port: "0" is not a port`}, ""},
		{"proxy port too large", Options{ProxyPort: "70000"}, []string{`proxy port: "70000" is not a port`}, ""},
		{"proxy port list", Options{ProxyPort: "80,81"}, []string{`proxy port: "80,81" is not a port`}, ""},
		{"proxy port with a sign", Options{ProxyPort: "+80"}, []string{`proxy port: "+80" is not a port`}, ""},
		{"inbound capture port not a number", Options{InboundCapturePort: "abc"}, []string{`inbound capture port: "abc" is not a port`}, ""},
		{"inbound tunnel port negative", Options{InboundTunnelPort: "-1"}, []string{`inbound tunnel port: "-1" is not a port`}, ""},
		{"proxy uid not a number, reported once", Options{ProxyUID: "abc"}, []string{`proxy uid: "abc" is not a numeric user or group id`}, "proxy gid"},
		{"proxy uid too large", Options{ProxyUID: "4294967296"}, []string{`proxy uid: "4294967296" is not a numeric`}, ""},
		{"proxy uid (uid_t)-1", Options{ProxyUID: "4294967295"}, []string{`proxy uid: "4294967295" is not a usable user or group id`}, ""},
		{"proxy uid of only commas", Options{ProxyUID: ","}, []string{"proxy uid: at least one uid is required"}, ""},
		{"proxy gid not a number", Options{ProxyGID: "1,x"}, []string{`proxy gid: "x" is not a numeric user or group id`}, ""},
		{"mode in lower case", Options{InboundInterceptionMode: "tproxy"}, []string{`interception mode: "tproxy" is not an interception mode`}, ""},
		{"mode unknown", Options{InboundInterceptionMode: "NONE"}, []string{`interception mode: "NONE"`}, ""},
		{"tproxy mark not a number", Options{InboundTProxyMark: "x"}, []string{`tproxy mark: "x" is not a packet mark`}, ""},
		{"tproxy mark too large", Options{InboundTProxyMark: "4294967296"}, []string{`tproxy mark: "4294967296" is not a packet mark`}, ""},
		{"tproxy mark 0 in TPROXY mode", Options{InboundInterceptionMode: "TPROXY", InboundTProxyMark: "0"}, []string{"tproxy mark: must be non-zero"}, ""},
		{"tproxy route table not a number", Options{InboundTProxyRouteTable: "main"}, []string{`tproxy route table: "main" is not a routing table number`}, ""},
		{"tproxy route table reserved", Options{InboundInterceptionMode: "TPROXY", InboundTProxyRouteTable: "254"}, []string{"tproxy route table: 254 is not a usable routing table"}, ""},
		{"tproxy route table 0", Options{InboundInterceptionMode: "TPROXY", InboundTProxyRouteTable: "0"}, []string{"tproxy route table: 0 is not"}, ""},
		{"inbound port too large", Options{InboundPortsInclude: "80,70000"}, []string{`inbound ports: "70000" is not a port`}, ""},
		{"inbound * in a list", Options{InboundPortsInclude: "*,80"}, []string{`inbound ports: "*" is not a port`}, ""},
		{"inbound port range", Options{InboundPortsInclude: "80-90"}, []string{`inbound ports: "80-90" is not a port`}, ""},
		{"inbound port with inner space", Options{InboundPortsInclude: "80 90"}, []string{`inbound ports: "80 90" is not a port`}, ""},
		{"inbound exclude *", Options{InboundPortsExclude: "*"}, []string{`inbound ports exclude: "*" is not a port`}, ""},
		{"inbound exclude 0", Options{InboundPortsExclude: "0"}, []string{`inbound ports exclude: "0" is not a port`}, ""},
		{"outbound CIDR prefix too long", Options{OutboundIPRangesInclude: "10.0.0.0/33"}, []string{`outbound CIDRs: "10.0.0.0/33" is not a CIDR`}, ""},
		{"outbound CIDRs separated by a space", Options{OutboundIPRangesInclude: "10.0.0.0/8 10.1.0.0/16"}, []string{`outbound CIDRs: "10.0.0.0/8 10.1.0.0/16" is not a CIDR`}, ""},
		{"outbound * in a list", Options{OutboundIPRangesInclude: "*,10.0.0.0/8"}, []string{`outbound CIDRs: "*" is not an IP address or CIDR`}, ""},
		{"outbound zoned address", Options{OutboundIPRangesInclude: "fe80::1%eth0"}, []string{`outbound CIDRs: "fe80::1%eth0" is not an IP address`}, ""},
		{"outbound host name", Options{OutboundIPRangesInclude: "example.com"}, []string{`outbound CIDRs: "example.com" is not an IP address`}, ""},
		{"outbound exclude *", Options{OutboundIPRangesExclude: " * "}, []string{`outbound CIDRs exclude: "*" is not allowed`}, ""},
		{"outbound exclude bad CIDR", Options{OutboundIPRangesExclude: "1.1.0.0/16,1.1.0/16"}, []string{`outbound CIDRs exclude: "1.1.0/16" is not a CIDR`}, ""},
		{"outbound ports *", Options{OutboundPortsInclude: "*"}, []string{`outbound ports: "*" is not a port`}, ""},
		{"outbound ports too large", Options{OutboundPortsInclude: "65536"}, []string{`outbound ports: "65536" is not a port`}, ""},
		{"outbound ports exclude not a number", Options{OutboundPortsExclude: "redis"}, []string{`outbound ports exclude: "redis" is not a port`}, ""},
		{"interface wildcard", Options{ExcludeInterfaces: "eth0+"}, []string{`exclude interfaces: "eth0+" is not an interface name`}, ""},
		{"interface with a space", Options{ExcludeInterfaces: "a b"}, []string{`exclude interfaces: "a b" is not an interface name`}, ""},
		{"interface of 16 characters", Options{ExcludeInterfaces: "abcdefghijklmnop"}, []string{`exclude interfaces: "abcdefghijklmnop" is not an interface name (1-15 characters)`}, ""},
		{"interface with a slash", Options{ExcludeInterfaces: "eth0/1"}, []string{`"eth0/1" is not an interface name`}, ""},
		{"interface alias", Options{ExcludeInterfaces: "eth0:1"}, []string{`"eth0:1" is not an interface name`}, ""},
		{"interface dot", Options{ExcludeInterfaces: "."}, []string{`"." is not an interface name`}, ""},
		{"interface dot dot", Options{ExcludeInterfaces: ".."}, []string{`".." is not an interface name`}, ""},
		{"interface with a shell separator", Options{ExcludeInterfaces: "eth0;reboot"}, []string{`"eth0;reboot" is not an interface name`}, ""},
		{"interface with a command substitution", Options{ExcludeInterfaces: "$(id)"}, []string{`"$(id)" is not an interface name`}, ""},
		{"interface that reads as an option", Options{ExcludeInterfaces: "-j"}, []string{`"-j" is not an interface name`}, ""},
		{"interface with a quote", Options{ExcludeInterfaces: `eth"0`}, []string{`"eth\"0" is not an interface name`}, ""},
		{"interface not ASCII", Options{ExcludeInterfaces: "éth0"}, []string{`"éth0" is not an interface name`}, ""},
		{"interface negation", Options{RerouteVirtualInterfaces: "!eth0"}, []string{`reroute virtual interfaces: "!eth0" is not an interface name`}, ""},
		{"owner groups include and exclude both set", Options{OwnerGroupsInclude: "java", OwnerGroupsExclude: "ftp"}, []string{`owner groups: include "java" and exclude "ftp" cannot both be set`}, "owner groups: owner groups"},
		{"owner group with a space", Options{OwnerGroupsInclude: "a b"}, []string{`owner groups include: "a b" is not a group name or id`}, "owner groups: owner groups"},
		{"owner group starting with a digit", Options{OwnerGroupsExclude: "1java"}, []string{`owner groups exclude: "1java" is not a group name or id`}, ""},
		{"owner group with a shell separator", Options{OwnerGroupsExclude: "ja;va"}, []string{`owner groups exclude: "ja;va" is not a group name or id`}, ""},
		{"owner group with $ inside", Options{OwnerGroupsExclude: "a$b"}, []string{`"a$b" is not a group name or id`}, ""},
		{"owner group id with a leading zero", Options{OwnerGroupsInclude: "010"}, []string{`owner groups include: "010" is not a group id (iptables reads a leading zero as octal)`}, ""},
		{"owner group id too large", Options{OwnerGroupsExclude: "4294967296"}, []string{`owner groups exclude: "4294967296" is not a numeric`}, ""},
		{"owner group name too long", Options{OwnerGroupsExclude: strings.Repeat("g", 33)}, []string{`is not a group name or id`}, ""},
		{"too many owner groups", Options{OwnerGroupsInclude: long}, []string{"owner groups include: 65 groups given, at most 64"}, ""},
		{"loopback CIDR outside 127/8", Options{HostIPv4LoopbackCidr: "10.0.0.0/8"}, []string{`IPv4 loopback CIDR: "10.0.0.0/8" is not an IPv4 loopback CIDR`}, ""},
		{"loopback CIDR wider than /8", Options{HostIPv4LoopbackCidr: "127.0.0.1/7"}, []string{`IPv4 loopback CIDR: "127.0.0.1/7"`}, ""},
		{"loopback without a length", Options{HostIPv4LoopbackCidr: "127.0.0.1"}, []string{`IPv4 loopback CIDR: "127.0.0.1"`}, ""},
		{"loopback IPv6", Options{HostIPv4LoopbackCidr: "::1/128"}, []string{`IPv4 loopback CIDR: "::1/128"`}, ""},
		{"DNS server as a CIDR", Options{DNSServers: []string{"10.96.0.10/32"}}, []string{`DNS servers: "10.96.0.10/32" is not an IP address`}, ""},
		{"DNS server empty", Options{DNSServers: []string{""}}, []string{`DNS servers: "" is not an IP address`}, ""},
		{"every bad option is reported", Options{ProxyPort: "x", InboundPortsInclude: "y", ExcludeInterfaces: "a+"}, []string{
			`proxy port: "x"`, `inbound ports: "y"`, `exclude interfaces: "a+"`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.opts.Spec()
			if err == nil {
				t.Fatalf("Spec() = %+v, want an error", s)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if tt.notErr != "" && strings.Contains(err.Error(), tt.notErr) {
				t.Errorf("error %q contains %q", err, tt.notErr)
			}
		})
	}
}

// TestSpecValidateNamesTheField: specs built in code are checked as strictly as parsed
// ones.
func TestSpecValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name    string
		change  func(s *Spec)
		wantErr string
	}{
		{"proxy port 0", func(s *Spec) { s.ProxyPort = 0 }, "proxy port: must be 1-65535, got 0"},
		{"DNS port 0", func(s *Spec) { s.DNSPort = 0 }, "DNS port: must be 1-65535, got 0"},
		{"no proxy uid", func(s *Spec) { s.ProxyUIDs = nil }, "proxy uid: at least one uid is required"},
		{"no proxy gid", func(s *Spec) { s.ProxyGIDs = nil }, "proxy gid: at least one gid is required"},
		{"proxy uid (uid_t)-1", func(s *Spec) { s.ProxyUIDs = []uint32{InvalidID} }, "proxy uid: 4294967295 is (uid_t)-1"},
		{"proxy gid (gid_t)-1", func(s *Spec) { s.ProxyGIDs = []uint32{1, InvalidID} }, "proxy gid: 4294967295 is (gid_t)-1"},
		{"unknown mode", func(s *Spec) { s.Mode = 7 }, "interception mode: unknown mode 7"},
		{"route table 255", func(s *Spec) { s.Mode, s.TProxyRouteTable = ModeTProxy, 255 }, "tproxy route table: 255 is not"},
		{"* with ports", func(s *Spec) { s.InboundPorts = PortSet{All: true, Ports: []uint16{80}} }, "inbound ports: '*' cannot be combined"},
		{"* with CIDRs", func(s *Spec) { s.OutboundCIDRs = PrefixSet{All: true, Prefixes: prefixes("10.0.0.0/8")} }, "outbound CIDRs: '*' cannot be combined"},
		{"port 0 in a list", func(s *Spec) { s.OutboundPortsExclude = []uint16{0} }, "outbound ports exclude: port 0 is not a port"},
		{"unmasked CIDR", func(s *Spec) { s.OutboundCIDRsExclude = prefixes("10.0.0.1/8") }, `outbound CIDRs exclude: "10.0.0.1/8" is not a canonical CIDR`},
		{"invalid CIDR", func(s *Spec) { s.OutboundCIDRs.Prefixes = []netip.Prefix{{}} }, "outbound CIDRs: "},
		{"bad interface", func(s *Spec) { s.RerouteVirtualInterfaces = []string{"eth+"} }, `reroute virtual interfaces: "eth+" is not an interface name`},
		{"bad group", func(s *Spec) { s.OwnerGroups.Groups = []string{"a b"} }, `owner groups: "a b" is not a group name or id`},
		{"too many groups", func(s *Spec) { s.OwnerGroups.Groups = make([]string, 65) }, "owner groups: 65 groups given"},
		{"zoned DNS server", func(s *Spec) { s.DNS.Servers = []netip.Addr{netip.MustParseAddr("fe80::1%eth0")} }, `DNS servers: "fe80::1%eth0" is not a plain IP address`},
		{"loopback not loopback", func(s *Spec) { s.HostIPv4Loopback = netip.MustParsePrefix("10.0.0.1/32") }, `IPv4 loopback CIDR: "10.0.0.1/32" is not an IPv4 loopback CIDR`},
		{"loopback wider than /8", func(s *Spec) { s.HostIPv4Loopback = netip.MustParsePrefix("127.0.0.1/4") }, `"127.0.0.1/4" is wider than 127.0.0.0/8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultSpec()
			tt.change(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
			if _, err := Build(s); err == nil {
				t.Errorf("Build accepted an invalid spec")
			}
		})
	}
}

// TestSpecValidateErrorsAreStable: the same invalid spec always gives the same message,
// so errors can be compared and logged without noise.
func TestSpecValidateErrorsAreStable(t *testing.T) {
	s := DefaultSpec()
	s.ProxyPort, s.InboundCapturePort, s.InboundTunnelPort, s.DNSPort = 0, 0, 0, 0
	first := s.Validate().Error()
	for range 50 {
		if got := s.Validate().Error(); got != first {
			t.Fatalf("Validate() changed its message:\n%s\nthen\n%s", first, got)
		}
	}
	want := "proxy port: must be 1-65535, got 0\ninbound capture port: must be 1-65535, got 0\n" +
		"inbound tunnel port: must be 1-65535, got 0\nDNS port: must be 1-65535, got 0"
	if first != want {
		t.Errorf("Validate() = %q, want %q", first, want)
	}
}

// TestValidateNames checks the two name validators on their own, since what they accept
// ends up in rules.
func TestValidateNames(t *testing.T) {
	ifaces := map[string]bool{
		"eth0": true, "net1": true, "eth0.100": true, "br-ab_1": true, "abcdefghijklmno": true, "a": true, "veth-1.2": true,
		"": false, ".": false, "..": false, "abcdefghijklmnop": false, "eth0+": false, "eth*": false, "a b": false,
		"a\tb": false, "a/b": false, "a:b": false, "!a": false, `a"b`: false, "a'b": false, `a\b`: false, "a;b": false,
		"a|b": false, "a&b": false, "$a": false, "a`b": false, "a(b)": false, "a<b": false, "a>b": false, "a{b}": false,
		"a[b]": false, "a?b": false, "a~b": false, "a#b": false, "a=b": false, "a%b": false, "a@b": true, "a,b": false,
		"-a": false, "é": false, "a\x00": false, "a\x7f": false,
	}
	for name, ok := range ifaces {
		if err := ValidateInterfaceName(name); (err == nil) != ok {
			t.Errorf("ValidateInterfaceName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	groups := map[string]bool{
		"java": true, "202": true, "0": true, "_x": true, "a-b.c": true, "host$": true, "4294967294": true, "4294967295": false, strings.Repeat("g", 32): true,
		"": false, "1java": false, "-x": false, ".x": false, "a b": false, "a$b": false, "$": false, "a;b": false, "a:b": false,
		"4294967296": false, "010": false, "00": false, strings.Repeat("g", 33): false, "é": false, "*": false, "a,b": false,
	}
	for g, ok := range groups {
		if err := ValidateGroup(g); (err == nil) != ok {
			t.Errorf("ValidateGroup(%q) = %v, want ok=%v", g, err, ok)
		}
	}
}

// TestParseGroupFilter covers the include/exclude pair on its own.
func TestParseGroupFilter(t *testing.T) {
	tests := []struct {
		include, exclude string
		want             GroupFilter
		wantErr          string
	}{
		{"", "", GroupFilter{Except: true}, ""},
		{"*", "", GroupFilter{Except: true}, ""},
		{" * ", " ", GroupFilter{Except: true}, ""},
		{"java,202", "", GroupFilter{Groups: []string{"java", "202"}}, ""},
		{"", "888, ftp,", GroupFilter{Except: true, Groups: []string{"888", "ftp"}}, ""},
		{",", "", GroupFilter{}, ""},
		{"java", "ftp", GroupFilter{}, `owner groups: include "java" and exclude "ftp" cannot both be set`},
		{"*,java", "", GroupFilter{}, `owner groups include: "*" is not a group name or id`},
		{"", "*", GroupFilter{}, `owner groups exclude: "*" is not a group name or id`},
	}
	for _, tt := range tests {
		got, err := ParseGroupFilter(tt.include, tt.exclude)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseGroupFilter(%q, %q) error = %v, want %q", tt.include, tt.exclude, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseGroupFilter(%q, %q): %v", tt.include, tt.exclude, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmpPlan); diff != "" {
			t.Errorf("ParseGroupFilter(%q, %q) (-want +got):\n%s", tt.include, tt.exclude, diff)
		}
	}
}
