package istioiptables

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/user"
	"slices"
	"strings"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// currentNamespace names the calling code's own network namespace for capture,
// which opens the path before switching. capture opens it from an unlocked
// goroutine, and an unlocked thread is always in the process's namespace (netns.Do
// never unlocks a thread it could not switch back), so the calling thread's
// namespace is the process's one; /proc/self would instead name the main thread's,
// which a locked goroutine elsewhere could have switched.
const currentNamespace = "/proc/thread-self/ns/net"

// Run does what cfg asks, in the order Steps gives. Logs go to slog's default
// logger; only --dry-run writes to stdout.
func Run(ctx context.Context, cfg Config) error {
	log := slog.Default()
	if cfg.NetworkNamespace != "" {
		log = log.With("netns", cfg.NetworkNamespace)
	}
	spec, err := completeSpec(log, cfg)
	if err != nil {
		return err
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		return err
	}
	nsPath := cfg.NetworkNamespace
	if nsPath == "" {
		nsPath = currentNamespace
	}

	for _, s := range Steps(cfg) {
		switch s {
		case StepDescribeRemoval:
			log.Info("dry run: would remove the capture", "nftables", cfg.NativeNftables)
		case StepRemove:
			b, err := newBackend(cfg)
			if err != nil {
				return err
			}
			routing, err := capture.Cleanup(ctx, nsPath, b, removalPlan(spec, plan))
			if err != nil {
				return err
			}
			log.Info("capture removed", "backend", b.Name(), "routingRemoved", routing)
		case StepPrint:
			log.Info("dry run: printing the rules, changing nothing", "ipv6", spec.IPv6)
			text, err := DryRunText(plan, cfg.NativeNftables)
			if err != nil {
				return err
			}
			if _, err := os.Stdout.WriteString(text); err != nil {
				return fmt.Errorf("write rules: %w", err)
			}
		case StepApply:
			if err := apply(ctx, log, cfg, nsPath, plan); err != nil {
				return err
			}
		case StepValidate:
			if err := validate(ctx, log, cfg, spec); err != nil {
				return err
			}
		}
	}
	return nil
}

// removalPlan is what --cleanup-only removes: the plan, and in TPROXY mode its
// policy routing even when the plan has none (no inbound ports given now): an
// apply with inbound ports added it, and the removal takes only what is there.
func removalPlan(spec redirect.Spec, plan *redirect.Plan) *redirect.Plan {
	if plan.Routing != nil || spec.Mode != redirect.ModeTProxy {
		return plan
	}
	p := *plan
	p.Routing = &redirect.Routing{Mark: spec.TProxyMark, Table: spec.TProxyRouteTable}
	return &p
}

func apply(ctx context.Context, log *slog.Logger, cfg Config, nsPath string, plan *redirect.Plan) error {
	b, err := newBackend(cfg)
	if err != nil {
		return err
	}
	// One hold of the namespace's apply lock for both: the verify reads what
	// this apply left, not another's apply or removal made in between.
	changed, diffs, err := capture.ApplyAndVerify(ctx, nsPath, b, plan)
	if err != nil {
		return err
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s capture differs from the plan right after applying it:\n  %s", b.Name(), strings.Join(diffs, "\n  "))
	}
	log.Info("capture applied", "backend", b.Name(), "changed", changed)
	return nil
}

// inNamespace runs fn in the namespace at path, or directly for the current one.
func inNamespace(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return netns.Do(path, fn)
}

// MaxResolvConfBytes bounds what is read of --resolv-conf (a few hundred bytes in
// a pod); it is read as a regular file only, so a named pipe there is refused
// rather than waited on.
const MaxResolvConfBytes = 64 << 10

// completeSpec adds the facts Istio takes from the environment to the configured
// spec: the proxy uid and gid when not given, IPv6 from the pod's addresses, and
// the DNS servers to capture from resolv.conf.
func completeSpec(log *slog.Logger, cfg Config) (redirect.Spec, error) {
	spec := cfg.Capture
	if len(spec.ProxyUIDs) == 0 {
		spec.ProxyUIDs = []uint32{ProxyUID(cfg.EnvoyUser, func(name string) (string, error) {
			u, err := user.Lookup(name)
			if err != nil {
				return "", err
			}
			return u.Uid, nil
		})}
	}
	if len(spec.ProxyGIDs) == 0 {
		spec.ProxyGIDs = slices.Clone(spec.ProxyUIDs)
	}

	var addrs []netip.Addr
	err := inNamespace(cfg.NetworkNamespace, func() error {
		var err error
		addrs, err = interfaceAddrs()
		return err
	})
	if err != nil {
		return redirect.Spec{}, fmt.Errorf("read the pod's addresses: %w", err)
	}
	addr, ipv6, ok := PodAddress(addrs, cfg.DualStack)
	if ok {
		log.Debug("pod address", "addr", addr, "ipv6", ipv6)
	} else {
		// Istio refuses to run here; a pod always has an address, so this is a bare
		// namespace (tests, debugging), where IPv4-only capture is the useful answer.
		log.Warn("no pod address found (only loopback or link-local): capturing IPv4 only")
	}
	spec.IPv6 = ipv6

	if spec.DNS.Enabled && !spec.DNS.CaptureAll {
		data, err := regularfile.ReadBounded(cfg.ResolvConf, MaxResolvConfBytes)
		if err != nil {
			return redirect.Spec{}, fmt.Errorf("read DNS servers to capture: %w", err)
		}
		servers, skipped := DNSServers(string(data))
		if len(skipped) > 0 {
			log.Warn("DNS servers not captured: not plain IP addresses", "servers", skipped, "file", cfg.ResolvConf)
		}
		spec.DNS.Servers = servers
	}
	if err := spec.Validate(); err != nil {
		return redirect.Spec{}, fmt.Errorf("invalid capture settings: %w", err)
	}
	return spec, nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}

// DryRunText is the --dry-run output: per family, the iptables-restore input in
// Istio's form, or with nativeNftables the nft script; then, as comments, the
// routing and addresses the capture adds.
func DryRunText(plan *redirect.Plan, nativeNftables bool) (string, error) {
	var b strings.Builder
	if nativeNftables {
		script, err := renderNftables(plan)
		if err != nil {
			return "", err
		}
		b.WriteString(script)
	} else {
		for i := range plan.Families {
			fp := &plan.Families[i]
			tool := "iptables-restore"
			if fp.Family == redirect.IPv6 {
				tool = "ip6tables-restore"
			}
			fmt.Fprintf(&b, "# %s input (%s)\n", tool, fp.Family)
			b.WriteString(iptables.RenderPlanText(fp))
		}
	}
	if r := plan.Routing; r != nil {
		for _, fp := range plan.Families {
			v := "-4"
			if fp.Family == redirect.IPv6 {
				v = "-6"
			}
			fmt.Fprintf(&b, "# ip %s rule add fwmark %d lookup %d\n", v, r.Mark, r.Table)
			fmt.Fprintf(&b, "# ip %s route add local default dev lo table %d\n", v, r.Table)
		}
	}
	if p := plan.IPv6InboundPassthroughAddr; p.IsValid() {
		fmt.Fprintf(&b, "# ip -6 addr add %s dev lo\n", p)
	}
	return b.String(), nil
}
