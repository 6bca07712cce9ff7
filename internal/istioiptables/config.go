package istioiptables

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Config is everything one istio-iptables invocation was asked to do, validated.
type Config struct {
	// Capture holds the capture settings. ProxyUIDs and ProxyGIDs are empty when
	// neither a flag nor a variable gave them: Run fills them from the environment as
	// Istio does. IPv6 and DNS.Servers are facts Run fills in as well.
	Capture redirect.Spec
	// EnvoyUser is the user whose uid is the proxy uid when no uid was given.
	EnvoyUser string
	// DualStack makes IPv6 capture depend on any pod address being IPv6 rather than
	// the first one.
	DualStack bool

	DryRun        bool
	CleanupOnly   bool
	SkipRuleApply bool
	RunValidation bool

	// NativeNftables selects the nftables backend; otherwise iptables, in
	// IptablesMode ("" picks nft or legacy from the installed binaries).
	NativeNftables bool
	IptablesMode   string

	// NetworkNamespace is the namespace to program; empty means the current one.
	NetworkNamespace string

	// ProbePort and ProbeTimeout configure --run-validation.
	ProbePort    uint16
	ProbeTimeout time.Duration

	// ResolvConf is where the DNS servers to capture are read from.
	ResolvConf string

	LogLevel slog.Level
	LogJSON  bool
}

// Defaults shared with Istio.
const (
	DefaultProbePort    = 15002
	DefaultProbeTimeout = 5 * time.Second
	DefaultEnvoyUser    = "istio-proxy"
	DefaultResolvConf   = "/etc/resolv.conf"
)

// DefaultConfig is the configuration of an invocation without flags or variables.
func DefaultConfig() Config {
	spec := redirect.DefaultSpec()
	spec.ProxyUIDs, spec.ProxyGIDs = nil, nil
	return Config{
		Capture:      spec,
		EnvoyUser:    DefaultEnvoyUser,
		ProbePort:    DefaultProbePort,
		ProbeTimeout: DefaultProbeTimeout,
		ResolvConf:   DefaultResolvConf,
		LogLevel:     slog.LevelInfo,
	}
}

// Environment-only settings (Istio has no flags for them).
const (
	EnvOwnerGroupsInclude = "ISTIO_OUTBOUND_OWNER_GROUPS"
	EnvOwnerGroupsExclude = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE"
	EnvIPv4LoopbackCIDR   = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"
	EnvEnvoyUser          = "ENVOY_USER"
)

type valueKind uint8

const (
	stringValue valueKind = iota
	boolValue
)

// setting is one flag with the environment variables that set it when the flag is
// absent. When several variables are set, the last one listed wins, as in Istio.
type setting struct {
	name, short string
	envs        []string
	kind        valueKind
	def         string // shown in --help only
	usage       string
	hidden      bool
	set         func(c *Config, v string) error
}

func (s setting) flagName() string {
	if s.short != "" {
		return "-" + s.short + "/--" + s.name
	}
	return "--" + s.name
}

// captureField sets one capture field from its Istio string form.
func captureField(f redirect.Field) func(*Config, string) error {
	return func(c *Config, v string) error { return c.Capture.Set(f, v) }
}

func toggle(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := redirect.ParseBool(v)
		if err != nil {
			return err
		}
		*field(c) = b
		return nil
	}
}

// settings are Istio's istio-iptables flags, with its environment variable names
// (the flag name upper-cased, '-' -> '_', plus the aliases Istio also reads), and
// this project's additions.
var settings = []setting{
	{name: "envoy-port", short: "p", envs: []string{"ENVOY_PORT"}, def: "15001",
		usage: "port the outbound TCP traffic is redirected to",
		set:   captureField(redirect.FieldProxyPort)},
	{name: "inbound-capture-port", short: "z", envs: []string{"INBOUND_CAPTURE_PORT"}, def: "15006",
		usage: "port the inbound TCP traffic is redirected to",
		set:   captureField(redirect.FieldInboundCapturePort)},
	{name: "inbound-tunnel-port", short: "e", envs: []string{"INBOUND_TUNNEL_PORT"}, def: "15008",
		usage: "the proxy's HBONE tunnel port, never captured",
		set:   captureField(redirect.FieldInboundTunnelPort)},
	{name: "proxy-uid", short: "u", envs: []string{"PROXY_UID"},
		usage: "comma-separated uids whose traffic is not captured (default: uid of $ENVOY_USER, else 1337)",
		set:   captureField(redirect.FieldProxyUIDs)},
	{name: "proxy-gid", short: "g", envs: []string{"PROXY_GID"},
		usage: "comma-separated gids whose traffic is not captured (default: the proxy uids)",
		set:   captureField(redirect.FieldProxyGIDs)},
	{name: "istio-inbound-interception-mode", short: "m", envs: []string{"ISTIO_INBOUND_INTERCEPTION_MODE"}, def: "REDIRECT",
		usage: `inbound capture mode, "REDIRECT" or "TPROXY"`,
		set:   captureField(redirect.FieldMode)},
	{name: "istio-inbound-tproxy-mark", short: "t", envs: []string{"ISTIO_INBOUND_TPROXY_MARK"}, def: "1337",
		usage: "packet mark of TPROXY-captured traffic",
		set:   captureField(redirect.FieldTProxyMark)},
	{name: "istio-inbound-tproxy-route-table", short: "r", envs: []string{"ISTIO_INBOUND_TPROXY_ROUTE_TABLE"}, def: "133",
		usage: "routing table of TPROXY-captured traffic",
		set:   captureField(redirect.FieldTProxyRouteTable)},
	{name: "istio-inbound-ports", short: "b", envs: []string{"ISTIO_INBOUND_PORTS"},
		usage: `comma-separated inbound ports to capture, "*" for all; empty captures none`,
		set:   captureField(redirect.FieldInboundPorts)},
	{name: "istio-local-exclude-ports", short: "d", envs: []string{"ISTIO_LOCAL_EXCLUDE_PORTS"},
		usage: `comma-separated inbound ports not captured (only with -b "*")`,
		set:   captureField(redirect.FieldInboundPortsExclude)},
	{name: "istio-exclude-interfaces", short: "c", envs: []string{"ISTIO_EXCLUDE_INTERFACES"},
		usage: "comma-separated interfaces whose traffic is never captured",
		set:   captureField(redirect.FieldExcludeInterfaces)},
	{name: "istio-service-cidr", short: "i", envs: []string{"ISTIO_SERVICE_CIDR"},
		usage: `comma-separated outbound CIDRs to capture, "*" for all; empty captures none`,
		set:   captureField(redirect.FieldOutboundCIDRs)},
	{name: "istio-service-exclude-cidr", short: "x", envs: []string{"ISTIO_SERVICE_EXCLUDE_CIDR"},
		usage: "comma-separated outbound CIDRs not captured",
		set:   captureField(redirect.FieldOutboundCIDRsExclude)},
	{name: "istio-outbound-ports", short: "q", envs: []string{"ISTIO_OUTBOUND_PORTS"},
		usage: "comma-separated outbound ports always captured",
		set:   captureField(redirect.FieldOutboundPorts)},
	{name: "istio-local-outbound-ports-exclude", short: "o", envs: []string{"ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"},
		usage: "comma-separated outbound ports never captured",
		set:   captureField(redirect.FieldOutboundPortsExclude)},
	{name: "kube-virt-interfaces", short: "k", envs: []string{"KUBE_VIRT_INTERFACES"},
		usage: "comma-separated virtual interfaces whose inbound traffic is treated as outbound",
		set:   captureField(redirect.FieldRerouteVirtualInterfaces)},
	{name: "dry-run", short: "n", envs: []string{"DRY_RUN"}, kind: boolValue,
		usage: "print the rules instead of applying them",
		set:   toggle(func(c *Config) *bool { return &c.DryRun })},
	{name: "skip-rule-apply", envs: []string{"SKIP_RULE_APPLY"}, kind: boolValue,
		usage: "do not program anything (with --run-validation: only validate)",
		set:   toggle(func(c *Config) *bool { return &c.SkipRuleApply })},
	{name: "run-validation", envs: []string{"RUN_VALIDATION"}, kind: boolValue,
		usage: "check that traffic is redirected to the proxy; exit 126 if not",
		set:   toggle(func(c *Config) *bool { return &c.RunValidation })},
	{name: "iptables-probe-port", envs: []string{"IPTABLES_PROBE_PORT"}, def: "15002",
		usage: "port the validation probe connects to",
		set: func(c *Config, v string) (err error) {
			if strings.TrimSpace(v) != "" {
				c.ProbePort, err = redirect.ParsePort(v)
			}
			return err
		}},
	{name: "probe-timeout", envs: []string{"PROBE_TIMEOUT"}, def: "5s",
		usage: "how long validation keeps trying",
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return fmt.Errorf("%q is not a positive duration (like 5s)", v)
			}
			c.ProbeTimeout = d
			return nil
		}},
	{name: "redirect-dns", envs: []string{"REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"}, kind: boolValue,
		usage: "capture DNS to the agent on port 15053",
		set:   captureField(redirect.FieldRedirectDNS)},
	{name: "capture-all-dns", envs: []string{"CAPTURE_ALL_DNS"}, kind: boolValue,
		usage: "with --redirect-dns: capture all port 53 traffic, not only to the resolv.conf servers",
		set:   captureField(redirect.FieldCaptureAllDNS)},
	{name: "drop-invalid", envs: []string{"DROP_INVALID", "INVALID_DROP"}, kind: boolValue,
		usage: "drop packets conntrack considers invalid",
		set:   captureField(redirect.FieldDropInvalid)},
	{name: "dual-stack", envs: []string{"DUAL_STACK", "ISTIO_DUAL_STACK"}, kind: boolValue,
		usage: "capture IPv6 too when any pod address is IPv6",
		set:   toggle(func(c *Config) *bool { return &c.DualStack })},
	{name: "network-namespace", envs: []string{"NETWORK_NAMESPACE"},
		usage: "network namespace to program (a path like /var/run/netns/NAME); default: the current one",
		set: func(c *Config, v string) error {
			if v != "" && !filepath.IsAbs(v) {
				return fmt.Errorf("%q is not an absolute path", v)
			}
			c.NetworkNamespace = v
			return nil
		}},
	{name: "cleanup-only", envs: []string{"CLEANUP_ONLY"}, kind: boolValue,
		usage: "remove the capture instead of applying it",
		set:   toggle(func(c *Config) *bool { return &c.CleanupOnly })},
	{name: "native-nftables", envs: []string{"NATIVE_NFTABLES"}, kind: boolValue,
		usage: "program native nftables instead of iptables",
		set:   toggle(func(c *Config) *bool { return &c.NativeNftables })},
	{name: "iptables-mode", envs: []string{"IPTABLES_MODE"}, def: "auto",
		usage: `iptables implementation, "legacy", "nft" or "auto" (nft when installed)`,
		set: func(c *Config, v string) error {
			switch m := strings.TrimSpace(v); m {
			case "", "auto":
				c.IptablesMode = ""
			case "legacy", "nft":
				c.IptablesMode = m
			default:
				return fmt.Errorf("%q is not an iptables mode (legacy, nft or auto)", v)
			}
			return nil
		}},
	{name: "resolv-conf", def: DefaultResolvConf, hidden: true,
		usage: "resolv.conf to read DNS servers from",
		set: func(c *Config, v string) error {
			if strings.TrimSpace(v) == "" {
				return errors.New(`"" is not a path`)
			}
			c.ResolvConf = v
			return nil
		}},
	{name: "log_output_level", def: "default:info",
		usage: `log level, Istio style: "info" or "default:debug"`,
		set: func(c *Config, v string) error {
			l, err := cli.ParseOutputLevel(v)
			if err != nil {
				return err
			}
			c.LogLevel = l.Slog()
			return nil
		}},
	{name: "log_as_json", kind: boolValue,
		usage: "log in JSON",
		set:   toggle(func(c *Config) *bool { return &c.LogJSON })},
	// Accepted so that Istio's invocations keep working; they change nothing here:
	// the xtables lock is always per namespace, and apply always reconciles.
	{name: "cni-mode", envs: []string{"CNI_MODE"}, kind: boolValue, hidden: true, set: ignoreBool},
	{name: "reconcile", envs: []string{"RECONCILE"}, kind: boolValue, hidden: true, set: ignoreBool},
	{name: "force-apply", envs: []string{"FORCE_APPLY"}, kind: boolValue, hidden: true, set: ignoreBool},
}

func ignoreBool(_ *Config, v string) error {
	_, err := redirect.ParseBool(v)
	return err
}

func newFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("istio-iptables", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SortFlags = false
	for _, s := range settings {
		usage := s.usage
		if len(s.envs) > 0 {
			usage += " (env " + strings.Join(s.envs, ", ") + ")"
		}
		if s.kind == boolValue {
			fs.BoolP(s.name, s.short, false, usage)
		} else {
			fs.StringP(s.name, s.short, s.def, usage)
		}
		if s.hidden {
			_ = fs.MarkHidden(s.name)
		}
	}
	return fs
}

// Usage is the --help text.
func Usage() string {
	return "Usage: istio-iptables [flags]\n\n" +
		"Sets up (or prints, removes, validates) the traffic capture of an Istio sidecar.\n\n" +
		"Flags (a flag overrides its environment variable):\n" + newFlagSet().FlagUsages() +
		"\nEnvironment only:\n" +
		"  " + EnvOwnerGroupsInclude + "          groups whose outbound traffic is captured (default \"*\")\n" +
		"  " + EnvOwnerGroupsExclude + "  groups whose outbound traffic is not captured\n" +
		"  " + EnvIPv4LoopbackCIDR + "    IPv4 loopback range of the pod (default 127.0.0.1/32)\n" +
		"  " + EnvEnvoyUser + "                           user whose uid is the default proxy uid (default istio-proxy)\n" +
		"\nExit status: 0 success, 1 error, 126 validation found traffic not redirected.\n"
}

// ErrHelp is returned by ParseConfig for -h/--help.
var ErrHelp = pflag.ErrHelp

// ParseConfig turns command-line arguments and environment variables (looked up
// with lookupEnv) into a Config. A flag overrides its variables. Every error names
// the flag or variable and quotes the value.
func ParseConfig(args []string, lookupEnv func(string) (string, bool)) (Config, error) {
	fs := newFlagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return Config{}, ErrHelp
		}
		return Config{}, fmt.Errorf("%w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q: istio-iptables takes only flags (see --help)", fs.Arg(0))
	}
	c := DefaultConfig()
	var errs []error
	for _, s := range settings {
		var value, source string
		if fs.Changed(s.name) {
			value, source = fs.Lookup(s.name).Value.String(), "flag "+s.flagName()
		} else {
			for i := len(s.envs) - 1; i >= 0; i-- {
				if v, ok := lookupEnv(s.envs[i]); ok && strings.TrimSpace(v) != "" {
					value, source = v, "environment variable "+s.envs[i]
					break
				}
			}
		}
		if source == "" {
			continue
		}
		if err := s.set(&c, value); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s: %w", source, err))
		}
	}
	errs = append(errs, parseEnvOnly(&c, lookupEnv)...)
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func parseEnvOnly(c *Config, lookupEnv func(string) (string, bool)) []error {
	var errs []error
	get := func(name string) string {
		v, _ := lookupEnv(name)
		return strings.TrimSpace(v)
	}
	include, exclude := get(EnvOwnerGroupsInclude), get(EnvOwnerGroupsExclude)
	if include != "" && include != "*" && exclude != "" {
		errs = append(errs, fmt.Errorf("environment variables %s=%q and %s=%q cannot both be set",
			EnvOwnerGroupsInclude, include, EnvOwnerGroupsExclude, exclude))
	} else {
		for _, e := range []struct {
			name  string
			field redirect.Field
		}{{EnvOwnerGroupsInclude, redirect.FieldOwnerGroupsInclude}, {EnvOwnerGroupsExclude, redirect.FieldOwnerGroupsExclude}, {EnvIPv4LoopbackCIDR, redirect.FieldHostIPv4Loopback}} {
			if v := get(e.name); v != "" {
				if err := c.Capture.Set(e.field, v); err != nil {
					errs = append(errs, fmt.Errorf("invalid environment variable %s: %w", e.name, err))
				}
			}
		}
	}
	if v := get(EnvEnvoyUser); v != "" {
		c.EnvoyUser = v
	}
	return errs
}

// validate checks what no single setting can: combinations.
func (c *Config) validate() error {
	if c.NativeNftables && c.IptablesMode != "" {
		return fmt.Errorf("--iptables-mode %q cannot be combined with --native-nftables", c.IptablesMode)
	}
	if c.RunValidation && (c.ProbePort == c.Capture.ProxyPort || c.ProbePort == c.Capture.InboundCapturePort) {
		return fmt.Errorf("--iptables-probe-port %d must differ from the capture ports %d and %d",
			c.ProbePort, c.Capture.ProxyPort, c.Capture.InboundCapturePort)
	}
	spec := c.Capture
	if len(spec.ProxyUIDs) == 0 {
		spec.ProxyUIDs = []uint32{redirect.DefaultProxyUID} // a stand-in until Run knows it
	}
	if len(spec.ProxyGIDs) == 0 {
		spec.ProxyGIDs = spec.ProxyUIDs
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("invalid capture settings: %w", err)
	}
	return nil
}
