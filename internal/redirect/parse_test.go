package redirect_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

var prefixes = specs.Prefixes

// TestSetAcceptsIstioInputs: every field, in the forms Istio accepts, becomes the
// typed value. Each case changes DefaultSpec as expected.
func TestSetAcceptsIstioInputs(t *testing.T) {
	tests := []struct {
		name string
		opts specs.Settings
		want func(s *Spec)
	}{
		{"empty options are Istio's defaults", specs.Settings{}, func(s *Spec) {}},
		{"proxy port", specs.Settings{FieldProxyPort: "15101"}, func(s *Spec) { s.ProxyPort = 15101 }},
		{"proxy port with spaces", specs.Settings{FieldProxyPort: " 15101 "}, func(s *Spec) { s.ProxyPort = 15101 }},
		{"inbound capture port", specs.Settings{FieldInboundCapturePort: "15106"}, func(s *Spec) { s.InboundCapturePort = 15106 }},
		{"inbound tunnel port", specs.Settings{FieldInboundTunnelPort: "65535"}, func(s *Spec) { s.InboundTunnelPort = 65535 }},
		{"proxy uids; gids default to them", specs.Settings{FieldProxyUIDs: "3,4"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{3, 4}, []uint32{3, 4} }},
		{"proxy uid and gid apart", specs.Settings{FieldProxyUIDs: "3", FieldProxyGIDs: " 5 ,"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{3}, []uint32{5} }},
		{"proxy gid alone", specs.Settings{FieldProxyGIDs: "5"}, func(s *Spec) { s.ProxyGIDs = []uint32{5} }},
		{"uid 0 and the largest uid", specs.Settings{FieldProxyUIDs: "0,4294967294"}, func(s *Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{0, 4294967294}, []uint32{0, 4294967294} }},
		{"mode REDIRECT", specs.Settings{FieldMode: "REDIRECT"}, func(s *Spec) {}},
		{"mode TPROXY", specs.Settings{FieldMode: "TPROXY"}, func(s *Spec) { s.Mode = ModeTProxy }},
		{"tproxy mark and table", specs.Settings{FieldMode: "TPROXY", FieldTProxyMark: "7", FieldTProxyRouteTable: "200"}, func(s *Spec) { s.Mode, s.TProxyMark, s.TProxyRouteTable = ModeTProxy, 7, 200 }},
		{"inbound ports *", specs.Settings{FieldInboundPorts: "*"}, func(s *Spec) { s.InboundPorts = PortSet{All: true} }},
		{"inbound ports * with spaces", specs.Settings{FieldInboundPorts: " * "}, func(s *Spec) { s.InboundPorts = PortSet{All: true} }},
		{"inbound ports list", specs.Settings{FieldInboundPorts: "80, 443"}, func(s *Spec) { s.InboundPorts = PortSet{Ports: []uint16{80, 443}} }},
		{"inbound ports exclude with a trailing comma", specs.Settings{FieldInboundPorts: "*", FieldInboundPortsExclude: "6000,7000,"}, func(s *Spec) {
			s.InboundPorts, s.InboundPortsExclude = PortSet{All: true}, []uint16{6000, 7000}
		}},
		{"duplicate ports are dropped, order kept", specs.Settings{FieldInboundPortsExclude: "7000,6000,7000"}, func(s *Spec) { s.InboundPortsExclude = []uint16{7000, 6000} }},
		{"empty items are dropped", specs.Settings{FieldOutboundPorts: ",, 80 ,,"}, func(s *Spec) { s.OutboundPorts = []uint16{80} }},
		{"outbound CIDRs *", specs.Settings{FieldOutboundCIDRs: "*"}, func(s *Spec) { s.OutboundCIDRs = PrefixSet{All: true} }},
		{"outbound CIDRs are masked", specs.Settings{FieldOutboundCIDRs: "10.0.0.1/8, fd00::1/64"}, func(s *Spec) { s.OutboundCIDRs.Prefixes = prefixes("10.0.0.0/8", "fd00::/64") }},
		{"bare addresses are host routes", specs.Settings{FieldOutboundCIDRs: "10.1.2.3,fd00::1"}, func(s *Spec) { s.OutboundCIDRs.Prefixes = prefixes("10.1.2.3/32", "fd00::1/128") }},
		{"a mapped IPv4 address is IPv4", specs.Settings{FieldOutboundCIDRsExclude: "::ffff:10.1.2.3"}, func(s *Spec) { s.OutboundCIDRsExclude = prefixes("10.1.2.3/32") }},
		{"outbound CIDRs exclude", specs.Settings{FieldOutboundCIDRsExclude: "169.254.169.254,10.0.0.0/24,"}, func(s *Spec) { s.OutboundCIDRsExclude = prefixes("169.254.169.254/32", "10.0.0.0/24") }},
		{"outbound ports exclude", specs.Settings{FieldOutboundPortsExclude: "6379"}, func(s *Spec) { s.OutboundPortsExclude = []uint16{6379} }},
		{"interfaces", specs.Settings{FieldExcludeInterfaces: "net1, eth0.100,", FieldRerouteVirtualInterfaces: "br-ab_1"}, func(s *Spec) {
			s.ExcludeInterfaces, s.RerouteVirtualInterfaces = []string{"net1", "eth0.100"}, []string{"br-ab_1"}
		}},
		{"a 15-character interface name", specs.Settings{FieldExcludeInterfaces: "abcdefghijklmno"}, func(s *Spec) { s.ExcludeInterfaces = []string{"abcdefghijklmno"} }},
		{"owner groups include", specs.Settings{FieldOwnerGroupsInclude: "java, 202"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Groups: []string{"java", "202"}} }},
		{"owner groups include * is every group", specs.Settings{FieldOwnerGroupsInclude: "*"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true} }},
		{"owner groups exclude", specs.Settings{FieldOwnerGroupsExclude: "888,ftp,"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"888", "ftp"}} }},
		{"owner groups include * and an exclude list", specs.Settings{FieldOwnerGroupsInclude: "*", FieldOwnerGroupsExclude: "888"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"888"}} }},
		{"a machine account group name", specs.Settings{FieldOwnerGroupsExclude: "host$"}, func(s *Spec) { s.OwnerGroups = GroupFilter{Except: true, Groups: []string{"host$"}} }},
		{"loopback CIDR is kept as given", specs.Settings{FieldHostIPv4Loopback: "127.0.0.1/8"}, func(s *Spec) { s.HostIPv4Loopback = netip.MustParsePrefix("127.0.0.1/8") }},
		{"DNS", specs.Settings{FieldRedirectDNS: "true", FieldCaptureAllDNS: "true", FieldDNSServers: " 10.96.0.10 ,fd00::a,::ffff:1.1.1.1"}, func(s *Spec) {
			s.DNS = DNS{Enabled: true, CaptureAll: true, Servers: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::a"), netip.MustParseAddr("1.1.1.1")}}
		}},
		{"drop invalid and IPv6", specs.Settings{FieldDropInvalid: "true", FieldIPv6: "true"}, func(s *Spec) { s.DropInvalid, s.IPv6 = true, true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.opts.Spec()
			if err != nil {
				t.Fatalf("Spec(): %v", err)
			}
			want := DefaultSpec()
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

// TestSetRejectsBadInputs: each error quotes the value (and the test's settings name
// the field), so a pod author can find the annotation at fault.
func TestSetRejectsBadInputs(t *testing.T) {
	long := strings.Repeat("g,", MaxOwnerGroups) + "g"
	tests := []struct {
		name    string
		opts    specs.Settings
		wantErr []string
		notErr  string
	}{
		{"proxy port 0", specs.Settings{FieldProxyPort: "0"}, []string{`proxy port: "0" is not a port`}, ""},
		{"proxy port too large", specs.Settings{FieldProxyPort: "70000"}, []string{`proxy port: "70000" is not a port`}, ""},
		{"proxy port list", specs.Settings{FieldProxyPort: "80,81"}, []string{`proxy port: "80,81" is not a port`}, ""},
		{"proxy port with a sign", specs.Settings{FieldProxyPort: "+80"}, []string{`proxy port: "+80" is not a port`}, ""},
		{"proxy port with a leading zero", specs.Settings{FieldProxyPort: "015001"}, []string{`proxy port: "015001" is not a port: it has a leading zero, which iptables reads as octal`}, ""},
		{"an excluded port with a leading zero", specs.Settings{FieldOutboundPortsExclude: "80,08"}, []string{`"08" is not a port: it has a leading zero`}, ""},
		{"inbound capture port not a number", specs.Settings{FieldInboundCapturePort: "abc"}, []string{`inbound capture port: "abc" is not a port`}, ""},
		{"inbound tunnel port negative", specs.Settings{FieldInboundTunnelPort: "-1"}, []string{`inbound tunnel port: "-1" is not a port`}, ""},
		{"proxy uid not a number, reported once", specs.Settings{FieldProxyUIDs: "abc"}, []string{`proxy uid: "abc" is not a numeric user or group id`}, "proxy gid"},
		{"proxy uid too large", specs.Settings{FieldProxyUIDs: "4294967296"}, []string{`proxy uid: "4294967296" is not a numeric`}, ""},
		{"proxy uid (uid_t)-1", specs.Settings{FieldProxyUIDs: "4294967295"}, []string{`proxy uid: "4294967295" is not a usable user or group id`}, ""},
		{"proxy uid of only commas", specs.Settings{FieldProxyUIDs: ","}, []string{"proxy uid: at least one uid is required"}, ""},
		{"proxy gid not a number", specs.Settings{FieldProxyGIDs: "1,x"}, []string{`proxy gid: "x" is not a numeric user or group id`}, ""},
		{"mode in lower case", specs.Settings{FieldMode: "tproxy"}, []string{`interception mode: "tproxy" is not an interception mode`}, ""},
		{"mode unknown", specs.Settings{FieldMode: "NONE"}, []string{`interception mode: "NONE"`}, ""},
		{"tproxy mark not a number", specs.Settings{FieldTProxyMark: "x"}, []string{`tproxy mark: "x" is not a packet mark`}, ""},
		{"tproxy mark too large", specs.Settings{FieldTProxyMark: "4294967296"}, []string{`tproxy mark: "4294967296" is not a packet mark`}, ""},
		{"tproxy mark 0 in TPROXY mode", specs.Settings{FieldMode: "TPROXY", FieldTProxyMark: "0"}, []string{`tproxy mark: "0" is not a packet mark`}, ""},
		{"tproxy route table not a number", specs.Settings{FieldTProxyRouteTable: "main"}, []string{`tproxy route table: "main" is not a usable routing table`}, ""},
		{"tproxy route table reserved", specs.Settings{FieldMode: "TPROXY", FieldTProxyRouteTable: "254"}, []string{"tproxy route table: \"254\" is not a usable routing table"}, ""},
		{"tproxy route table 0", specs.Settings{FieldMode: "TPROXY", FieldTProxyRouteTable: "0"}, []string{"tproxy route table: \"0\" is not"}, ""},
		{"inbound port too large", specs.Settings{FieldInboundPorts: "80,70000"}, []string{`inbound ports: "70000" is not a port`}, ""},
		{"inbound * in a list", specs.Settings{FieldInboundPorts: "*,80"}, []string{`inbound ports: "*" is not a port`}, ""},
		{"inbound port range", specs.Settings{FieldInboundPorts: "80-90"}, []string{`inbound ports: "80-90" is not a port`}, ""},
		{"inbound port with inner space", specs.Settings{FieldInboundPorts: "80 90"}, []string{`inbound ports: "80 90" is not a port`}, ""},
		{"inbound exclude *", specs.Settings{FieldInboundPortsExclude: "*"}, []string{`inbound ports exclude: "*" is not a port`}, ""},
		{"inbound exclude 0", specs.Settings{FieldInboundPortsExclude: "0"}, []string{`inbound ports exclude: "0" is not a port`}, ""},
		{"outbound CIDR prefix too long", specs.Settings{FieldOutboundCIDRs: "10.0.0.0/33"}, []string{`outbound CIDRs: "10.0.0.0/33" is not a CIDR`}, ""},
		{"outbound CIDRs separated by a space", specs.Settings{FieldOutboundCIDRs: "10.0.0.0/8 10.1.0.0/16"}, []string{`outbound CIDRs: "10.0.0.0/8 10.1.0.0/16" is not a CIDR`}, ""},
		{"outbound * in a list", specs.Settings{FieldOutboundCIDRs: "*,10.0.0.0/8"}, []string{`outbound CIDRs: "*" is not an IP address or CIDR`}, ""},
		{"outbound zoned address", specs.Settings{FieldOutboundCIDRs: "fe80::1%eth0"}, []string{`outbound CIDRs: "fe80::1%eth0" is not an IP address`}, ""},
		{"outbound host name", specs.Settings{FieldOutboundCIDRs: "example.com"}, []string{`outbound CIDRs: "example.com" is not an IP address`}, ""},
		{"outbound exclude *", specs.Settings{FieldOutboundCIDRsExclude: " * "}, []string{`outbound CIDRs exclude: "*" is not allowed`}, ""},
		{"outbound exclude bad CIDR", specs.Settings{FieldOutboundCIDRsExclude: "1.1.0.0/16,1.1.0/16"}, []string{`outbound CIDRs exclude: "1.1.0/16" is not a CIDR`}, ""},
		{"outbound ports *", specs.Settings{FieldOutboundPorts: "*"}, []string{`outbound ports: "*" is not a port`}, ""},
		{"outbound ports too large", specs.Settings{FieldOutboundPorts: "65536"}, []string{`outbound ports: "65536" is not a port`}, ""},
		{"outbound ports exclude not a number", specs.Settings{FieldOutboundPortsExclude: "redis"}, []string{`outbound ports exclude: "redis" is not a port`}, ""},
		{"interface wildcard", specs.Settings{FieldExcludeInterfaces: "eth0+"}, []string{`exclude interfaces: "eth0+" is not an interface name`}, ""},
		{"interface with a space", specs.Settings{FieldExcludeInterfaces: "a b"}, []string{`exclude interfaces: "a b" is not an interface name`}, ""},
		{"interface of 16 characters", specs.Settings{FieldExcludeInterfaces: "abcdefghijklmnop"}, []string{`exclude interfaces: "abcdefghijklmnop" is not an interface name (1-15 characters)`}, ""},
		{"interface with a slash", specs.Settings{FieldExcludeInterfaces: "eth0/1"}, []string{`"eth0/1" is not an interface name`}, ""},
		{"interface alias", specs.Settings{FieldExcludeInterfaces: "eth0:1"}, []string{`"eth0:1" is not an interface name`}, ""},
		{"interface dot", specs.Settings{FieldExcludeInterfaces: "."}, []string{`"." is not an interface name`}, ""},
		{"interface dot dot", specs.Settings{FieldExcludeInterfaces: ".."}, []string{`".." is not an interface name`}, ""},
		{"interface with a shell separator", specs.Settings{FieldExcludeInterfaces: "eth0;reboot"}, []string{`"eth0;reboot" is not an interface name`}, ""},
		{"interface with a command substitution", specs.Settings{FieldExcludeInterfaces: "$(id)"}, []string{`"$(id)" is not an interface name`}, ""},
		{"interface that reads as an option", specs.Settings{FieldExcludeInterfaces: "-j"}, []string{`"-j" is not an interface name`}, ""},
		{"interface with a quote", specs.Settings{FieldExcludeInterfaces: `eth"0`}, []string{`"eth\"0" is not an interface name`}, ""},
		{"interface not ASCII", specs.Settings{FieldExcludeInterfaces: "éth0"}, []string{`"éth0" is not an interface name`}, ""},
		{"interface negation", specs.Settings{FieldRerouteVirtualInterfaces: "!eth0"}, []string{`reroute virtual interfaces: "!eth0" is not an interface name`}, ""},
		{"owner groups include and exclude both set", specs.Settings{FieldOwnerGroupsInclude: "java", FieldOwnerGroupsExclude: "ftp"}, []string{`owner groups exclude: cannot be combined with owner groups include "java"`}, "owner groups: owner groups"},
		{"owner group with a space", specs.Settings{FieldOwnerGroupsInclude: "a b"}, []string{`owner groups include: "a b" is not a group name or id`}, "owner groups: owner groups"},
		{"owner group starting with a digit", specs.Settings{FieldOwnerGroupsExclude: "1java"}, []string{`owner groups exclude: "1java" is not a group name or id`}, ""},
		{"owner group with a shell separator", specs.Settings{FieldOwnerGroupsExclude: "ja;va"}, []string{`owner groups exclude: "ja;va" is not a group name or id`}, ""},
		{"owner group with $ inside", specs.Settings{FieldOwnerGroupsExclude: "a$b"}, []string{`"a$b" is not a group name or id`}, ""},
		{"owner group id with a leading zero", specs.Settings{FieldOwnerGroupsInclude: "010"}, []string{`owner groups include: "010" is not a group id (iptables reads a leading zero as octal)`}, ""},
		{"owner group id too large", specs.Settings{FieldOwnerGroupsExclude: "4294967296"}, []string{`owner groups exclude: "4294967296" is not a numeric`}, ""},
		{"owner group name too long", specs.Settings{FieldOwnerGroupsExclude: strings.Repeat("g", 33)}, []string{`is not a group name or id`}, ""},
		{"too many owner groups", specs.Settings{FieldOwnerGroupsInclude: long}, []string{"owner groups include: 65 groups given, at most 64"}, ""},
		{"loopback CIDR outside 127/8", specs.Settings{FieldHostIPv4Loopback: "10.0.0.0/8"}, []string{`IPv4 loopback CIDR: "10.0.0.0/8" is not an IPv4 loopback CIDR`}, ""},
		{"loopback CIDR wider than /8", specs.Settings{FieldHostIPv4Loopback: "127.0.0.1/7"}, []string{`IPv4 loopback CIDR: "127.0.0.1/7"`}, ""},
		{"loopback without a length", specs.Settings{FieldHostIPv4Loopback: "127.0.0.1"}, []string{`IPv4 loopback CIDR: "127.0.0.1"`}, ""},
		{"loopback IPv6", specs.Settings{FieldHostIPv4Loopback: "::1/128"}, []string{`IPv4 loopback CIDR: "::1/128"`}, ""},
		{"DNS server as a CIDR", specs.Settings{FieldDNSServers: "10.96.0.10/32"}, []string{`DNS servers: "10.96.0.10/32" is not an IP address`}, ""},
		{"every bad option is reported", specs.Settings{FieldProxyPort: "x", FieldInboundPorts: "y", FieldExcludeInterfaces: "a+"}, []string{
			`proxy port: "x"`, `inbound ports: "y"`, `exclude interfaces: "a+"`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.opts.Spec()
			if err == nil {
				t.Fatalf("Spec() = %+v, want an error", s)
			}
			wanterr.Mentions(t, err, tt.wantErr...)
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

// TestSetOwnerGroups covers the include/exclude pair on its own. {Except: true} with
// no groups captures every group; {Except: false} with none captures no group, as
// Istio makes of a set but empty include list.
func TestSetOwnerGroups(t *testing.T) {
	const unset = "(unset)"
	tests := []struct {
		include, exclude string
		want             GroupFilter
		wantErr          string
	}{
		{unset, unset, GroupFilter{Except: true}, ""},
		{"*", unset, GroupFilter{Except: true}, ""},
		{" * ", " ", GroupFilter{Except: true}, ""},
		{"java,202", unset, GroupFilter{Groups: []string{"java", "202"}}, ""},
		{unset, "888, ftp,", GroupFilter{Except: true, Groups: []string{"888", "ftp"}}, ""},
		{"*", "888", GroupFilter{Except: true, Groups: []string{"888"}}, ""},
		{unset, "", GroupFilter{Except: true}, ""},
		{unset, ",", GroupFilter{Except: true}, ""},
		{"", unset, GroupFilter{}, ""},
		{" ", unset, GroupFilter{}, ""},
		{",", unset, GroupFilter{}, ""},
		{"", "", GroupFilter{}, ""},
		{"java", "ftp", GroupFilter{}, `owner groups exclude: cannot be combined with owner groups include "java"`},
		{"", "ftp", GroupFilter{}, `owner groups exclude: cannot be combined with owner groups include "" (set but empty: no group captured)`},
		{"*,java", unset, GroupFilter{}, `owner groups include: "*" is not a group name or id`},
		{unset, "*", GroupFilter{}, `owner groups exclude: "*" is not a group name or id`},
	}
	for _, tt := range tests {
		set := specs.Settings{}
		if tt.include != unset {
			set[FieldOwnerGroupsInclude] = tt.include
		}
		if tt.exclude != unset {
			set[FieldOwnerGroupsExclude] = tt.exclude
		}
		got, err := set.Spec()
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("owner groups (%q, %q): error = %v, want %q", tt.include, tt.exclude, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("owner groups (%q, %q): %v", tt.include, tt.exclude, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got.OwnerGroups, cmpPlan); diff != "" {
			t.Errorf("owner groups (%q, %q) (-want +got):\n%s", tt.include, tt.exclude, diff)
		}
	}
}

// TestEveryFieldHasANameAndASetter: a field added to the list without a name or a
// case in Set fails here, not when a user sets it.
func TestEveryFieldHasANameAndASetter(t *testing.T) {
	for _, f := range Fields() {
		if strings.HasPrefix(f.String(), "field ") {
			t.Errorf("field %d has no name", f)
		}
		s := DefaultSpec()
		if err := s.Set(f, "x"); err != nil && strings.Contains(err.Error(), "unknown capture setting") {
			t.Errorf("Set(%s) is not implemented", f)
		}
	}
	s := DefaultSpec()
	if err := s.Set(FieldEnd, "1"); err == nil {
		t.Error("Set accepted an unknown field")
	}
}
