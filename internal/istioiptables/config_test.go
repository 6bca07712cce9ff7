package istioiptables

import (
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

func envOf(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

var cmpNetip = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func TestParseConfigReadsFlagsAndEnvironmentLikeIstio(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want func(c *Config)
	}{
		{
			name: "no input gives Istio's defaults with the proxy uid left to the environment",
			want: func(c *Config) {},
		},
		{
			name: "the injected istio-init arguments",
			args: []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"},
			want: func(c *Config) {
				c.Capture.ProxyUIDs = []uint32{1337}
				c.Capture.OutboundCIDRs = redirect.PrefixSet{All: true}
				c.Capture.InboundPorts = redirect.PortSet{All: true}
				c.Capture.InboundPortsExclude = []uint16{15090, 15021, 15020}
			},
		},
		{
			name: "the injected istio-validation arguments",
			args: []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--run-validation", "--skip-rule-apply"},
			want: func(c *Config) {
				c.Capture.ProxyUIDs = []uint32{1337}
				c.Capture.OutboundCIDRs = redirect.PrefixSet{All: true}
				c.Capture.InboundPorts = redirect.PortSet{All: true}
				c.Capture.InboundPortsExclude = []uint16{15090, 15021, 15020}
				c.RunValidation, c.SkipRuleApply = true, true
			},
		},
		{
			name: "every long flag",
			args: []string{
				"--envoy-port=15101", "--inbound-capture-port=15106", "--inbound-tunnel-port=15108",
				"--proxy-uid=1000,1001", "--proxy-gid=2000", "--istio-inbound-interception-mode=TPROXY",
				"--istio-inbound-tproxy-mark=7", "--istio-inbound-tproxy-route-table=77",
				"--istio-inbound-ports=80,443", "--istio-local-exclude-ports=9090", "--istio-exclude-interfaces=eth1",
				"--istio-service-cidr=10.0.0.0/8,fd00::/8", "--istio-service-exclude-cidr=10.1.0.0/16",
				"--istio-outbound-ports=5432", "--istio-local-outbound-ports-exclude=3306", "--kube-virt-interfaces=net1,net2",
				"--dry-run", "--skip-rule-apply", "--run-validation", "--iptables-probe-port=16002", "--probe-timeout=2s",
				"--redirect-dns", "--capture-all-dns", "--drop-invalid", "--dual-stack", "--network-namespace=/var/run/netns/x",
				"--cleanup-only", "--iptables-mode=legacy", "--resolv-conf=/tmp/resolv.conf", "--log_output_level=debug", "--log_as_json",
				"--cni-mode", "--reconcile", "--force-apply",
			},
			want: func(c *Config) {
				s := &c.Capture
				s.ProxyPort, s.InboundCapturePort, s.InboundTunnelPort = 15101, 15106, 15108
				s.ProxyUIDs, s.ProxyGIDs = []uint32{1000, 1001}, []uint32{2000}
				s.Mode, s.TProxyMark, s.TProxyRouteTable = redirect.ModeTProxy, 7, 77
				s.InboundPorts = redirect.PortSet{Ports: []uint16{80, 443}}
				s.InboundPortsExclude = []uint16{9090}
				s.ExcludeInterfaces = []string{"eth1"}
				s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}}
				s.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
				s.OutboundPorts, s.OutboundPortsExclude = []uint16{5432}, []uint16{3306}
				s.RerouteVirtualInterfaces = []string{"net1", "net2"}
				s.DNS.Enabled, s.DNS.CaptureAll, s.DropInvalid = true, true, true
				c.DryRun, c.SkipRuleApply, c.RunValidation, c.CleanupOnly = true, true, true, true
				c.ProbePort, c.ProbeTimeout = 16002, 2*time.Second
				c.DualStack, c.NetworkNamespace, c.IptablesMode = true, "/var/run/netns/x", "legacy"
				c.ResolvConf, c.LogLevel, c.LogJSON = "/tmp/resolv.conf", slog.LevelDebug, true
			},
		},
		{
			name: "every short flag",
			args: []string{"-p", "1", "-z", "2", "-e", "3", "-u", "4", "-g", "5", "-m", "TPROXY", "-t", "6", "-r", "7",
				"-b", "8", "-d", "9", "-c", "eth9", "-i", "10.0.0.0/8", "-x", "10.9.0.0/16", "-q", "11", "-o", "12", "-k", "veth0", "-n"},
			want: func(c *Config) {
				s := &c.Capture
				s.ProxyPort, s.InboundCapturePort, s.InboundTunnelPort = 1, 2, 3
				s.ProxyUIDs, s.ProxyGIDs = []uint32{4}, []uint32{5}
				s.Mode, s.TProxyMark, s.TProxyRouteTable = redirect.ModeTProxy, 6, 7
				s.InboundPorts = redirect.PortSet{Ports: []uint16{8}}
				s.InboundPortsExclude = []uint16{9}
				s.ExcludeInterfaces = []string{"eth9"}
				s.OutboundCIDRs = redirect.PrefixSet{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
				s.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
				s.OutboundPorts, s.OutboundPortsExclude = []uint16{11}, []uint16{12}
				s.RerouteVirtualInterfaces = []string{"veth0"}
				c.DryRun = true
			},
		},
		{
			name: "every environment variable",
			env: map[string]string{
				"INBOUND_CAPTURE_PORT": "15106", "INBOUND_TUNNEL_PORT": "15108",
				"PROXY_UID": "1000", "PROXY_GID": "2000", "ISTIO_INBOUND_INTERCEPTION_MODE": "TPROXY",
				"ISTIO_INBOUND_TPROXY_MARK": "7", "ISTIO_INBOUND_TPROXY_ROUTE_TABLE": "77",
				"ISTIO_INBOUND_PORTS": "*", "ISTIO_LOCAL_EXCLUDE_PORTS": "15020", "ISTIO_EXCLUDE_INTERFACES": "eth1",
				"ISTIO_SERVICE_CIDR": "*", "ISTIO_SERVICE_EXCLUDE_CIDR": "169.254.169.254/32",
				"ISTIO_OUTBOUND_PORTS": "5432", "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE": "3306", "KUBE_VIRT_INTERFACES": "net1",
				"DRY_RUN": "true", "SKIP_RULE_APPLY": "1", "RUN_VALIDATION": "true", "IPTABLES_PROBE_PORT": "16002",
				"PROBE_TIMEOUT": "3s", "REDIRECT_DNS": "true", "CAPTURE_ALL_DNS": "true", "DROP_INVALID": "true",
				"DUAL_STACK": "true", "NETWORK_NAMESPACE": "/proc/1/ns/net", "CLEANUP_ONLY": "true",
				"NATIVE_NFTABLES": "true", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "999,nobody",
				"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.1/8", "ENVOY_USER": "envoy",
			},
			want: func(c *Config) {
				s := &c.Capture
				s.InboundCapturePort, s.InboundTunnelPort = 15106, 15108
				s.ProxyUIDs, s.ProxyGIDs = []uint32{1000}, []uint32{2000}
				s.Mode, s.TProxyMark, s.TProxyRouteTable = redirect.ModeTProxy, 7, 77
				s.InboundPorts = redirect.PortSet{All: true}
				s.InboundPortsExclude = []uint16{15020}
				s.ExcludeInterfaces = []string{"eth1"}
				s.OutboundCIDRs = redirect.PrefixSet{All: true}
				s.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}
				s.OutboundPorts, s.OutboundPortsExclude = []uint16{5432}, []uint16{3306}
				s.RerouteVirtualInterfaces = []string{"net1"}
				s.DNS.Enabled, s.DNS.CaptureAll, s.DropInvalid = true, true, true
				s.OwnerGroups = redirect.GroupFilter{Except: true, Groups: []string{"999", "nobody"}}
				s.HostIPv4Loopback = netip.MustParsePrefix("127.0.0.1/8")
				c.DryRun, c.SkipRuleApply, c.RunValidation, c.CleanupOnly, c.NativeNftables = true, true, true, true, true
				c.ProbePort, c.ProbeTimeout = 16002, 3*time.Second
				c.DualStack, c.NetworkNamespace, c.EnvoyUser = true, "/proc/1/ns/net", "envoy"
			},
		},
		{
			name: "a flag overrides its environment variable",
			args: []string{"-b", "80", "--redirect-dns=false", "--probe-timeout", "1s"},
			env:  map[string]string{"ISTIO_INBOUND_PORTS": "*", "REDIRECT_DNS": "true", "PROBE_TIMEOUT": "9s"},
			want: func(c *Config) {
				c.Capture.InboundPorts = redirect.PortSet{Ports: []uint16{80}}
				c.ProbeTimeout = time.Second
			},
		},
		{
			name: "ISTIO_META_DNS_CAPTURE enables DNS capture",
			env:  map[string]string{"ISTIO_META_DNS_CAPTURE": "true"},
			want: func(c *Config) { c.Capture.DNS.Enabled = true },
		},
		{
			name: "ISTIO_META_DNS_CAPTURE wins over REDIRECT_DNS as in Istio",
			env:  map[string]string{"REDIRECT_DNS": "true", "ISTIO_META_DNS_CAPTURE": "false"},
			want: func(c *Config) {},
		},
		{
			name: "INVALID_DROP enables drop-invalid",
			env:  map[string]string{"INVALID_DROP": "true"},
			want: func(c *Config) { c.Capture.DropInvalid = true },
		},
		{
			name: "ISTIO_DUAL_STACK enables dual stack",
			env:  map[string]string{"ISTIO_DUAL_STACK": "true"},
			want: func(c *Config) { c.DualStack = true },
		},
		{
			name: "an empty variable counts as unset",
			env:  map[string]string{"DRY_RUN": "", "INBOUND_CAPTURE_PORT": " "},
			want: func(c *Config) {},
		},
		{
			name: "ENVOY_PORT is not read: Istio binds --envoy-port to no variable",
			env:  map[string]string{"ENVOY_PORT": "15101"},
			want: func(c *Config) {},
		},
		{
			name: "owner groups include list from the environment",
			env:  map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "app,1234"},
			want: func(c *Config) { c.Capture.OwnerGroups = redirect.GroupFilter{Groups: []string{"app", "1234"}} },
		},
		{
			name: "a set but empty owner groups include list captures no group, as in Istio",
			env:  map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": ""},
			want: func(c *Config) { c.Capture.OwnerGroups = redirect.GroupFilter{} },
		},
		{
			name: "a set but empty owner groups exclude list excludes none",
			env:  map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": ""},
			want: func(c *Config) {},
		},
		{
			name: "auto iptables mode is the default mode",
			args: []string{"--iptables-mode", "auto"},
			want: func(c *Config) {},
		},
		{
			name: "FORCE_IPTABLES_BINARY picks the iptables mode",
			env:  map[string]string{"FORCE_IPTABLES_BINARY": "legacy"},
			want: func(c *Config) { c.ForceIptablesBinary, c.IptablesMode = iptables.ModeLegacy, iptables.ModeLegacy },
		},
		{
			name: "--force-iptables-binary picks the iptables mode",
			args: []string{"--force-iptables-binary", "nft"},
			want: func(c *Config) { c.ForceIptablesBinary, c.IptablesMode = iptables.ModeNFT, iptables.ModeNFT },
		},
		{
			name: "an empty --force-iptables-binary detects",
			args: []string{"--force-iptables-binary="},
			want: func(c *Config) {},
		},
		{
			name: "--force-iptables-binary agreeing with IPTABLES_MODE",
			args: []string{"--force-iptables-binary", "nft"},
			env:  map[string]string{"IPTABLES_MODE": "nft"},
			want: func(c *Config) { c.ForceIptablesBinary, c.IptablesMode = iptables.ModeNFT, iptables.ModeNFT },
		},
		{
			name: "FORCE_IPTABLES_BINARY overrides an --iptables-mode of auto",
			args: []string{"--iptables-mode", "auto"},
			env:  map[string]string{"FORCE_IPTABLES_BINARY": "legacy"},
			want: func(c *Config) { c.ForceIptablesBinary, c.IptablesMode = iptables.ModeLegacy, iptables.ModeLegacy },
		},
		{
			name: "Istio's log levels",
			args: []string{"--log_output_level", "validation:debug,default:warn"},
			want: func(c *Config) { c.LogLevel = slog.LevelWarn },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig(tc.args, envOf(tc.env))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			want := DefaultConfig()
			tc.want(&want)
			if diff := cmp.Diff(want, got, cmpNetip); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrorsNameTheFlagOrVariableAndTheValue(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"unknown flag", []string{"--no-such-flag"}, nil, []string{"unknown flag: --no-such-flag"}},
		{"unknown shorthand", []string{"-y"}, nil, []string{"'y'"}},
		{"positional argument", []string{"clean"}, nil, []string{`unexpected argument "clean"`}},
		{"flag missing its value", []string{"-p"}, nil, []string{"-p"}},
		{"inbound port out of range", []string{"-b", "70000"}, nil, []string{"-b/--istio-inbound-ports", `"70000"`}},
		{"inbound port out of range in the environment", nil, map[string]string{"ISTIO_INBOUND_PORTS": "70000"}, []string{"ISTIO_INBOUND_PORTS", `"70000"`}},
		{"interface with shell metacharacters", []string{"-c", "eth0;rm"}, nil, []string{"-c/--istio-exclude-interfaces", `"eth0;rm"`}},
		{"virtual interface with a slash", []string{"-k", "a/b"}, nil, []string{"-k/--kube-virt-interfaces", `"a/b"`}},
		{"bad envoy port", []string{"-p", "abc"}, nil, []string{"-p/--envoy-port", `"abc"`}},
		{"bad capture port", []string{"-z", "-1"}, nil, []string{"-z/--inbound-capture-port", `"-1"`}},
		{"bad tunnel port", nil, map[string]string{"INBOUND_TUNNEL_PORT": "x"}, []string{"INBOUND_TUNNEL_PORT", `"x"`}},
		{"bad uid", []string{"-u", "istio"}, nil, []string{"-u/--proxy-uid", `"istio"`}},
		{"bad gid", nil, map[string]string{"PROXY_GID": "-5"}, []string{"PROXY_GID", `"-5"`}},
		{"bad mode", []string{"-m", "NONE"}, nil, []string{"-m/--istio-inbound-interception-mode", `"NONE"`}},
		{"bad mark", []string{"-t", "0x10"}, nil, []string{"-t/--istio-inbound-tproxy-mark", `"0x10"`}},
		{"reserved route table", []string{"-r", "254"}, nil, []string{"-r/--istio-inbound-tproxy-route-table", `"254"`}},
		{"bad local exclude port", []string{"-d", "15090,abc"}, nil, []string{"-d/--istio-local-exclude-ports", `"abc"`}},
		{"bad CIDR", []string{"-i", "10.0.0.0/33"}, nil, []string{"-i/--istio-service-cidr", `"10.0.0.0/33"`}},
		{"wildcard exclude CIDR", []string{"-x", "*"}, nil, []string{"-x/--istio-service-exclude-cidr", `"*"`}},
		{"bad exclude CIDR in the environment", nil, map[string]string{"ISTIO_SERVICE_EXCLUDE_CIDR": "nope"}, []string{"ISTIO_SERVICE_EXCLUDE_CIDR", `"nope"`}},
		{"bad outbound port", []string{"-q", "99999"}, nil, []string{"-q/--istio-outbound-ports", `"99999"`}},
		{"bad outbound exclude port", []string{"-o", "1-2"}, nil, []string{"-o/--istio-local-outbound-ports-exclude", `"1-2"`}},
		{"bad boolean flag", []string{"--dry-run=maybe"}, nil, []string{"dry-run", `"maybe"`}},
		{"bad boolean variable", nil, map[string]string{"DRY_RUN": "maybe"}, []string{"DRY_RUN", `"maybe"`}},
		{"bad DNS capture variable", nil, map[string]string{"ISTIO_META_DNS_CAPTURE": "yes"}, []string{"ISTIO_META_DNS_CAPTURE", `"yes"`}},
		{"bad invalid-drop variable", nil, map[string]string{"INVALID_DROP": "on"}, []string{"INVALID_DROP", `"on"`}},
		{"bad probe port", []string{"--iptables-probe-port", "70000"}, nil, []string{"--iptables-probe-port", `"70000"`}},
		{"bad probe timeout", []string{"--probe-timeout", "5"}, nil, []string{"--probe-timeout", `"5"`}},
		{"negative probe timeout in the environment", nil, map[string]string{"PROBE_TIMEOUT": "-1s"}, []string{"PROBE_TIMEOUT", `"-1s"`}},
		{"relative namespace path", []string{"--network-namespace", "netns/x"}, nil, []string{"--network-namespace", `"netns/x"`}},
		{"bad iptables mode", []string{"--iptables-mode", "ebtables"}, nil, []string{"--iptables-mode", `"ebtables"`}},
		{"bad log level", []string{"--log_output_level", "default:loud"}, nil, []string{"--log_output_level", `"default:loud"`}},
		{"bad owner group", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "a b"}, []string{"ISTIO_OUTBOUND_OWNER_GROUPS", `"a b"`}},
		{"bad excluded owner group", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "-x"}, []string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", `"-x"`}},
		{"owner groups include and exclude", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "a", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "b"},
			[]string{"ISTIO_OUTBOUND_OWNER_GROUPS=", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE="}},
		{"empty owner groups include and an exclude list", nil, map[string]string{"ISTIO_OUTBOUND_OWNER_GROUPS": "", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "b"},
			[]string{`ISTIO_OUTBOUND_OWNER_GROUPS=""`, `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE="b"`}},
		{"non-loopback loopback CIDR", nil, map[string]string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "10.0.0.1/32"}, []string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", `"10.0.0.1/32"`}},
		{"bad forced iptables binary", []string{"--force-iptables-binary", "auto"}, nil, []string{"--force-iptables-binary", `"auto"`}},
		{"bad forced iptables binary in the environment", nil, map[string]string{"FORCE_IPTABLES_BINARY": "NFT"}, []string{"FORCE_IPTABLES_BINARY", `"NFT"`}},
		{"forced iptables binary conflicting with the iptables mode", []string{"--iptables-mode", "nft"}, map[string]string{"FORCE_IPTABLES_BINARY": "legacy"},
			[]string{"FORCE_IPTABLES_BINARY", `"legacy"`, "IPTABLES_MODE", `"nft"`}},
		{"forced iptables binary with native nftables", []string{"--native-nftables", "--force-iptables-binary", "legacy"}, nil, []string{"--force-iptables-binary", "--native-nftables"}},
		{"iptables mode with native nftables", []string{"--native-nftables", "--iptables-mode", "nft"}, nil, []string{"--iptables-mode", "--native-nftables"}},
		{"probe port equal to a capture port", []string{"--run-validation", "--iptables-probe-port", "15006"}, nil, []string{"--iptables-probe-port", "15006"}},
		{"both bad values reported at once", []string{"-b", "70000", "-q", "x"}, nil, []string{"--istio-inbound-ports", "--istio-outbound-ports"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, envOf(tc.env))
			wanterr.Mentions(t, err, tc.want...)
		})
	}
}

func TestParseConfigHelpIsNotAnError(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		if _, err := ParseConfig([]string{arg}, envOf(nil)); !errors.Is(err, ErrHelp) {
			t.Errorf("ParseConfig(%s) = %v, want ErrHelp", arg, err)
		}
	}
	u := Usage()
	for _, want := range []string{"--istio-inbound-ports", "ISTIO_INBOUND_PORTS", EnvOwnerGroupsExclude, "126"} {
		if !strings.Contains(u, want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

// TestParseConfigRefusesAValueOverTheLimitNamingTheSettingAndItsLength: every
// flag and variable of istio-iptables, whether or not redirect.Spec parses it, is
// refused over redirect.MaxValueBytes with an error naming it and the value's
// length, without the value; at the limit a value is parsed as before.
func TestParseConfigRefusesAValueOverTheLimitNamingTheSettingAndItsLength(t *testing.T) {
	long := strings.Repeat("x", redirect.MaxValueBytes+1)
	length := "a value of 16385 bytes, longer than the limit of 16384"
	type input struct {
		name string
		args []string
		env  map[string]string
		want string
	}
	var cases []input
	for _, s := range table.Settings {
		if s.Name != "" {
			cases = append(cases, input{"--" + s.Name, []string{"--" + s.Name + "=" + long}, nil, "--" + s.Name})
			if s.Bool {
				cases = append(cases, input{"--" + s.Name + " as the next argument", []string{"--" + s.Name, long}, nil, "unexpected argument"})
			} else {
				cases = append(cases, input{"--" + s.Name + " as the next argument", []string{"--" + s.Name, "/" + long[1:]}, nil, "--" + s.Name})
			}
		}
		for _, env := range s.Envs {
			cases = append(cases, input{env, nil, map[string]string{env: long}, env})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, envOf(tc.env))
			if tc.want == "unexpected argument" { // a switch takes no separate value: the value is an argument
				if err == nil || len(err.Error()) > 256 {
					t.Errorf("a switch followed by a long argument: %v", err)
				}
				return
			}
			wanterr.Mentions(t, err, tc.want, length)
			if err != nil && len(err.Error()) > 256 {
				t.Errorf("the refusal is %d bytes: %.300s...", len(err.Error()), err)
			}
		})
	}
	for _, name := range []string{"network-namespace", "resolv-conf"} {
		at := "/" + long[:redirect.MaxValueBytes-1]
		if _, err := ParseConfig([]string{"--" + name, at}, envOf(nil)); err != nil {
			t.Errorf("--%s of exactly %d bytes: %v", name, redirect.MaxValueBytes, err)
		}
	}
}

// TestParseConfigQuotesALongValueShort: a bad value under the limit, of a setting
// redirect.Spec does not parse, is quoted by its first bytes and its length.
func TestParseConfigQuotesALongValueShort(t *testing.T) {
	long := strings.Repeat("y", 10000)
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"--network-namespace", []string{"--network-namespace", long}, nil, "--network-namespace"},
		{"--probe-timeout", []string{"--probe-timeout", long}, nil, "--probe-timeout"},
		{"--iptables-mode", []string{"--iptables-mode", long}, nil, "--iptables-mode"},
		{"--force-iptables-binary", []string{"--force-iptables-binary", long}, nil, "--force-iptables-binary"},
		{"--log_output_level", []string{"--log_output_level", long}, nil, "--log_output_level"},
		{"--log_output_level scoped", []string{"--log_output_level", "default:" + long}, nil, "--log_output_level"},
		{"--dry-run", []string{"--dry-run=" + long}, nil, "--dry-run"},
		{"DRY_RUN", nil, map[string]string{"DRY_RUN": long}, "DRY_RUN"},
		{"owner groups conflict", nil, map[string]string{EnvOwnerGroupsInclude: "a," + long, EnvOwnerGroupsExclude: "b"}, EnvOwnerGroupsInclude},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, envOf(tc.env))
			wanterr.Mentions(t, err, tc.want, " bytes)")
			if err != nil && len(err.Error()) > 512 {
				t.Errorf("the refusal is %d bytes: %.300s...", len(err.Error()), err)
			}
		})
	}
}
