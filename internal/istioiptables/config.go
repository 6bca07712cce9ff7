package istioiptables

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/cli"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/settings"
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
	IptablesMode   iptables.Mode
	// ForceIptablesBinary is Istio's --force-iptables-binary as given (auto when
	// empty or absent). ParseConfig folds it into IptablesMode, which alone
	// decides.
	ForceIptablesBinary iptables.Mode

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

// captureField sets one capture field from its Istio string form.
func captureField(f redirect.Field) func(*Config, string) error {
	return func(c *Config, v string) error { return c.Capture.Set(f, v) }
}

// captureEnv is captureField for the environment-only settings, which are read
// trimmed: an error quotes the value without its spaces.
func captureEnv(f redirect.Field) func(*Config, string) error {
	return func(c *Config, v string) error { return c.Capture.Set(f, strings.TrimSpace(v)) }
}

func toggle(field func(*Config) *bool) func(*Config, string) error {
	return settings.Field(field, redirect.ParseBool)
}

// table is Istio's istio-iptables flags, with its environment variable names (the
// flag name upper-cased, '-' -> '_', plus the aliases Istio also reads), this
// project's additions, and the settings Istio reads only from the environment.
// Defaults are shown in --help only: ParseConfig starts from DefaultConfig.
var table = settings.Table[Config]{Command: "istio-iptables", MaxValueBytes: redirect.MaxValueBytes, Settings: []settings.Setting[Config]{
	// Istio binds --envoy-port without a variable (ENVOY_PORT is only logged there),
	// so an ENVOY_PORT meant for something else never moves the outbound capture.
	{Name: "envoy-port", Short: "p", Default: "15001",
		Usage: "port the outbound TCP traffic is redirected to (no environment variable, as in Istio)",
		Set:   captureField(redirect.FieldProxyPort)},
	{Name: "inbound-capture-port", Short: "z", Envs: []string{"INBOUND_CAPTURE_PORT"}, Default: "15006",
		Usage: "port the inbound TCP traffic is redirected to",
		Set:   captureField(redirect.FieldInboundCapturePort)},
	{Name: "inbound-tunnel-port", Short: "e", Envs: []string{"INBOUND_TUNNEL_PORT"}, Default: "15008",
		Usage: "the proxy's HBONE tunnel port, never captured",
		Set:   captureField(redirect.FieldInboundTunnelPort)},
	{Name: "proxy-uid", Short: "u", Envs: []string{"PROXY_UID"},
		Usage: "comma-separated uids whose traffic is not captured (default: uid of $ENVOY_USER, else 1337)",
		Set:   captureField(redirect.FieldProxyUIDs)},
	{Name: "proxy-gid", Short: "g", Envs: []string{"PROXY_GID"},
		Usage: "comma-separated gids whose traffic is not captured (default: the proxy uids)",
		Set:   captureField(redirect.FieldProxyGIDs)},
	{Name: "istio-inbound-interception-mode", Short: "m", Envs: []string{"ISTIO_INBOUND_INTERCEPTION_MODE"}, Default: "REDIRECT",
		Usage: `inbound capture mode, "REDIRECT" or "TPROXY"`,
		Set:   captureField(redirect.FieldMode)},
	{Name: "istio-inbound-tproxy-mark", Short: "t", Envs: []string{"ISTIO_INBOUND_TPROXY_MARK"}, Default: "1337",
		Usage: "packet mark of TPROXY-captured traffic",
		Set:   captureField(redirect.FieldTProxyMark)},
	{Name: "istio-inbound-tproxy-route-table", Short: "r", Envs: []string{"ISTIO_INBOUND_TPROXY_ROUTE_TABLE"}, Default: "133",
		Usage: "routing table of TPROXY-captured traffic",
		Set:   captureField(redirect.FieldTProxyRouteTable)},
	{Name: "istio-inbound-ports", Short: "b", Envs: []string{"ISTIO_INBOUND_PORTS"},
		Usage: `comma-separated inbound ports to capture, "*" for all; empty captures none`,
		Set:   captureField(redirect.FieldInboundPorts)},
	{Name: "istio-local-exclude-ports", Short: "d", Envs: []string{"ISTIO_LOCAL_EXCLUDE_PORTS"},
		Usage: `comma-separated inbound ports not captured (only with -b "*")`,
		Set:   captureField(redirect.FieldInboundPortsExclude)},
	{Name: "istio-exclude-interfaces", Short: "c", Envs: []string{"ISTIO_EXCLUDE_INTERFACES"},
		Usage: "comma-separated interfaces whose traffic is never captured",
		Set:   captureField(redirect.FieldExcludeInterfaces)},
	{Name: "istio-service-cidr", Short: "i", Envs: []string{"ISTIO_SERVICE_CIDR"},
		Usage: `comma-separated outbound CIDRs to capture, "*" for all; empty captures none`,
		Set:   captureField(redirect.FieldOutboundCIDRs)},
	{Name: "istio-service-exclude-cidr", Short: "x", Envs: []string{"ISTIO_SERVICE_EXCLUDE_CIDR"},
		Usage: "comma-separated outbound CIDRs not captured",
		Set:   captureField(redirect.FieldOutboundCIDRsExclude)},
	{Name: "istio-outbound-ports", Short: "q", Envs: []string{"ISTIO_OUTBOUND_PORTS"},
		Usage: "comma-separated outbound ports always captured",
		Set:   captureField(redirect.FieldOutboundPorts)},
	{Name: "istio-local-outbound-ports-exclude", Short: "o", Envs: []string{"ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"},
		Usage: "comma-separated outbound ports never captured",
		Set:   captureField(redirect.FieldOutboundPortsExclude)},
	{Name: "kube-virt-interfaces", Short: "k", Envs: []string{"KUBE_VIRT_INTERFACES"},
		Usage: "comma-separated virtual interfaces whose inbound traffic is treated as outbound",
		Set:   captureField(redirect.FieldRerouteVirtualInterfaces)},
	{Name: "dry-run", Short: "n", Envs: []string{"DRY_RUN"}, Bool: true,
		Usage: "print the rules instead of applying them",
		Set:   toggle(func(c *Config) *bool { return &c.DryRun })},
	{Name: "skip-rule-apply", Envs: []string{"SKIP_RULE_APPLY"}, Bool: true,
		Usage: "do not program or remove anything (with --run-validation: only validate)",
		Set:   toggle(func(c *Config) *bool { return &c.SkipRuleApply })},
	{Name: "run-validation", Envs: []string{"RUN_VALIDATION"}, Bool: true,
		Usage: "check that traffic is redirected to the proxy; exit 126 if not",
		Set:   toggle(func(c *Config) *bool { return &c.RunValidation })},
	{Name: "iptables-probe-port", Envs: []string{"IPTABLES_PROBE_PORT"}, Default: "15002",
		Usage: "port the validation probe connects to",
		Set: func(c *Config, v string) (err error) {
			if strings.TrimSpace(v) != "" {
				c.ProbePort, err = redirect.ParsePort(v)
			}
			return err
		}},
	{Name: "probe-timeout", Envs: []string{"PROBE_TIMEOUT"}, Default: "5s",
		Usage: "how long validation keeps trying",
		Set: func(c *Config, v string) error {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return fmt.Errorf("%s is not a positive duration (like 5s)", redirect.Quote(v))
			}
			c.ProbeTimeout = d
			return nil
		}},
	{Name: "redirect-dns", Envs: []string{"REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"}, Bool: true,
		Usage: "capture DNS to the agent on port 15053",
		Set:   captureField(redirect.FieldRedirectDNS)},
	{Name: "capture-all-dns", Envs: []string{"CAPTURE_ALL_DNS"}, Bool: true,
		Usage: "with --redirect-dns: capture all port 53 traffic, not only to the resolv.conf servers",
		Set:   captureField(redirect.FieldCaptureAllDNS)},
	{Name: "drop-invalid", Envs: []string{"DROP_INVALID", "INVALID_DROP"}, Bool: true,
		Usage: "drop packets conntrack considers invalid",
		Set:   captureField(redirect.FieldDropInvalid)},
	{Name: "dual-stack", Envs: []string{"DUAL_STACK", "ISTIO_DUAL_STACK"}, Bool: true,
		Usage: "capture IPv6 too when any pod address is IPv6",
		Set:   toggle(func(c *Config) *bool { return &c.DualStack })},
	{Name: "network-namespace", Envs: []string{"NETWORK_NAMESPACE"},
		Usage: "network namespace to program (a path like /var/run/netns/NAME); default: the current one",
		Set: func(c *Config, v string) error {
			if v != "" && !filepath.IsAbs(v) {
				return fmt.Errorf("%s is not an absolute path", redirect.Quote(v))
			}
			c.NetworkNamespace = v
			return nil
		}},
	{Name: "cleanup-only", Envs: []string{"CLEANUP_ONLY"}, Bool: true,
		Usage: "remove the capture instead of applying it",
		Set:   toggle(func(c *Config) *bool { return &c.CleanupOnly })},
	{Name: "native-nftables", Envs: []string{"NATIVE_NFTABLES"}, Bool: true,
		Usage: "program native nftables instead of iptables",
		Set:   toggle(func(c *Config) *bool { return &c.NativeNftables })},
	{Name: "iptables-mode", Envs: []string{"IPTABLES_MODE"}, Default: "auto",
		Usage: `iptables implementation, "legacy", "nft" or "auto" (nft when installed)`,
		Set:   settings.Field(func(c *Config) *iptables.Mode { return &c.IptablesMode }, iptables.ParseMode)},
	{Name: "force-iptables-binary", Envs: []string{"FORCE_IPTABLES_BINARY"},
		Usage: `Istio's name for --iptables-mode: "legacy" or "nft"; empty detects`,
		Set:   settings.Field(func(c *Config) *iptables.Mode { return &c.ForceIptablesBinary }, parseForcedBinary)},
	{Name: "resolv-conf", Default: DefaultResolvConf, Hidden: true,
		Usage: "resolv.conf to read DNS servers from",
		Set: func(c *Config, v string) error {
			if strings.TrimSpace(v) == "" {
				return errors.New(`"" is not a path`)
			}
			c.ResolvConf = v
			return nil
		}},
	{Name: "log_output_level", Default: "default:info",
		Usage: `log level, Istio style: "info" or "default:debug"`,
		Set: func(c *Config, v string) error {
			l, err := cli.ParseOutputLevel(v)
			if err != nil {
				return err
			}
			c.LogLevel = l.Slog()
			return nil
		}},
	{Name: "log_as_json", Bool: true,
		Usage: "log in JSON",
		Set:   toggle(func(c *Config) *bool { return &c.LogJSON })},
	// Accepted so that Istio's invocations keep working; they change nothing here:
	// the xtables lock is always per namespace, and apply always reconciles.
	{Name: "cni-mode", Envs: []string{"CNI_MODE"}, Bool: true, Hidden: true, Set: ignoreBool},
	{Name: "reconcile", Envs: []string{"RECONCILE"}, Bool: true, Hidden: true, Set: ignoreBool},
	{Name: "force-apply", Envs: []string{"FORCE_APPLY"}, Bool: true, Hidden: true, Set: ignoreBool},
	// Environment only, as in Istio. A conflict between the two owner group lists
	// is reported by ParseConfig, which then reads neither. Set but empty, the
	// include list captures no group, as in Istio (unset, it is "*").
	{Envs: []string{EnvOwnerGroupsInclude}, EmptyIsValue: true,
		Usage: `groups whose outbound traffic is captured (default "*"; set but empty: none)`,
		Set:   captureEnv(redirect.FieldOwnerGroupsInclude)},
	{Envs: []string{EnvOwnerGroupsExclude}, Usage: "groups whose outbound traffic is not captured",
		Set: captureEnv(redirect.FieldOwnerGroupsExclude)},
	{Envs: []string{EnvIPv4LoopbackCIDR}, Usage: "IPv4 loopback range of the pod (default 127.0.0.1/32)",
		Set: captureEnv(redirect.FieldHostIPv4Loopback)},
	{Envs: []string{EnvEnvoyUser}, Usage: "user whose uid is the default proxy uid (default istio-proxy)",
		Set: func(c *Config, v string) error { c.EnvoyUser = strings.TrimSpace(v); return nil }},
}}

// parseForcedBinary parses --force-iptables-binary as Istio does: "legacy", "nft",
// or empty to detect; unlike --iptables-mode, "auto" is not one of its values.
func parseForcedBinary(v string) (iptables.Mode, error) {
	switch m := iptables.Mode(strings.TrimSpace(v)); m {
	case iptables.ModeAuto, iptables.ModeLegacy, iptables.ModeNFT:
		return m, nil
	}
	return "", fmt.Errorf("%s is not an iptables binary (legacy or nft; empty detects)", redirect.Quote(v))
}

func ignoreBool(_ *Config, v string) error {
	_, err := redirect.ParseBool(v)
	return err
}

// Usage is the --help text.
func Usage() string {
	return "Usage: istio-iptables [flags]\n\n" +
		"Sets up (or prints, removes, validates) the traffic capture of an Istio sidecar.\n\n" +
		"Flags (a flag overrides its environment variable):\n" + table.FlagUsages() +
		"\nEnvironment only:\n" + table.EnvUsages() +
		"\nExit status: 0 success, 1 error, 126 validation found traffic not redirected.\n"
}

// ErrHelp is returned by ParseConfig for -h/--help.
var ErrHelp = settings.ErrHelp

// ParseConfig turns command-line arguments and environment variables (looked up
// with lookupEnv) into a Config. A flag overrides its variables. Every error names
// the flag or variable and quotes the value (with redirect.Quote: a long one by its
// first bytes and its length); a value over redirect.MaxValueBytes, of any flag or
// variable, is refused before it is parsed, naming its length.
func ParseConfig(args []string, lookupEnv func(string) (string, bool)) (Config, error) {
	c := DefaultConfig()
	conflict := ownerGroupsConflict(lookupEnv)
	lookup := lookupEnv
	if conflict != nil {
		lookup = func(name string) (string, bool) {
			if name == EnvOwnerGroupsInclude || name == EnvOwnerGroupsExclude {
				return "", false
			}
			return lookupEnv(name)
		}
	}
	err := table.Parse(&c, args, lookup)
	if errors.Is(err, ErrHelp) {
		return Config{}, err
	}
	if err := errors.Join(err, conflict); err != nil {
		return Config{}, err
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// ownerGroupsConflict reports both owner group lists being set: Istio captures the
// groups listed or all but those listed, not both. A set but empty include list is
// a list (of no group), so it conflicts with an exclude list too.
func ownerGroupsConflict(lookupEnv func(string) (string, bool)) error {
	include, includeSet := lookupEnv(EnvOwnerGroupsInclude)
	include = strings.TrimSpace(include)
	exclude, _ := lookupEnv(EnvOwnerGroupsExclude)
	exclude = strings.TrimSpace(exclude)
	if includeSet && include != "*" && exclude != "" {
		return fmt.Errorf("environment variables %s=%s and %s=%s cannot both be set",
			EnvOwnerGroupsInclude, redirect.Quote(include), EnvOwnerGroupsExclude, redirect.Quote(exclude))
	}
	return nil
}

// validate checks what no single setting can: combinations. It also folds
// --force-iptables-binary into IptablesMode.
func (c *Config) validate() error {
	if c.NativeNftables && c.IptablesMode != iptables.ModeAuto {
		return fmt.Errorf("--iptables-mode %q cannot be combined with --native-nftables", c.IptablesMode)
	}
	if force := c.ForceIptablesBinary; force != iptables.ModeAuto {
		switch {
		case c.NativeNftables:
			return fmt.Errorf("--force-iptables-binary (FORCE_IPTABLES_BINARY) %q cannot be combined with --native-nftables", force)
		case c.IptablesMode != iptables.ModeAuto && c.IptablesMode != force:
			return fmt.Errorf("--force-iptables-binary (FORCE_IPTABLES_BINARY) %q conflicts with --iptables-mode (IPTABLES_MODE) %q",
				force, c.IptablesMode)
		}
		c.IptablesMode = force
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
