package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// KernelProbeBound bounds CheckNode's kernel probe: making a namespace and
// writing one pod's rules there takes milliseconds (a module the kernel loads
// on first use, tens); a probe that has not answered by then is reported as a
// failure naming the bound, and the caller goes on.
const KernelProbeBound = 5 * time.Second

// NodeCheck is what CheckNode found of a node's means to run the plugin's
// backend.
type NodeCheck struct {
	// Backend is the backend the plugin uses there: nftables, or iptables-nft or
	// iptables-legacy; iptables (mode unknown) when the flavour is detection's
	// and the node's tools are not visible.
	Backend string
	// Tools are the node's iptables tools the plugin runs (iptables backend, the
	// node's tools seen).
	Tools *iptables.Tools
	// Families are the address families whose rules the kernel took in the
	// probe, IPv4 first; IPv6Skipped says why IPv6 was not tried when the probe
	// ran without it.
	Families    []redirect.Family
	IPv6Skipped string
	// NotChecked says, one entry per part, what could not be checked and why
	// (the node's tools not visible, the capabilities to make a namespace
	// missing): not a problem of the node's, and the plugin may still fail there.
	NotChecked []string
	// Problem says why the plugin's ADD fails on this node, naming the setting
	// and what is missing; nil when nothing checked is missing.
	Problem error
}

// Reasons of a NodeCheck's Problem (errors.Is).
var (
	ErrNodeToolsMissing = errors.New("the node lacks the plugin's tools")
	ErrKernelRefused    = errors.New("the node's kernel refuses the plugin's rules")
)

// ProbeDirPrefix starts the name of the directory, in the plugin's xtables
// directory, where a kernel probe keeps its locks (livetemp: an agent's start
// removes one a killed probe left, RemoveAbandonedProbeDirs).
const ProbeDirPrefix = "node-check-"

// CheckNode says whether the node can run the backend cfg gives the plugin: its
// tools, with the plugin's own choice of them (iptables.NodeTools in view, the
// node's filesystem as this process sees it: all of it, some of its
// directories, or nothing), and its kernel, by writing the rules of a pod of
// Istio's default sidecar capture (every port in and out; IPv4, and IPv6 too
// where the node has IPv6, nodeIPv6) in a throwaway network namespace
// (netns.InThrowaway) with the same backend code, within KernelProbeBound. In
// iptables mode the probe's tools are this process's (the agent's image carries
// both flavours), in the flavour the node's plugin picks: the node's kernel is
// what is tried. The node's own namespace is never touched. What cannot be seen
// is never counted missing: a tool that may be where the view does not reach is
// NotChecked. It runs nothing of the plugin's ADD, whose cost it leaves as it
// is: the agent runs it.
func CheckNode(ctx context.Context, cfg *Config, view iptables.NodeView) NodeCheck {
	var c NodeCheck
	mode := cfg.IptablesMode
	switch {
	case cfg.Backend == BackendNftables:
		c.Backend = nftables.NewBackend().Name()
	case view.Visible():
		t, err := iptables.NodeTools(view, cfg.IptablesMode)
		mode = t.Mode
		c.Backend = "iptables-" + string(mode)
		var missing *iptables.MissingToolsError
		switch {
		case errors.As(err, &missing) && len(missing.Unseen) > 0:
			c.NotChecked = append(c.NotChecked, "the node's iptables tools: none of them found where this agent sees the node, and they may be where it does not: "+err.Error())
			if cfg.IptablesMode == iptables.ModeAuto {
				c.NotChecked = append(c.NotChecked, "the kernel: not tried, the iptables flavour the plugin detects from the node's tools not known")
				return c
			}
		case err != nil:
			fix := "install the node's iptables package, or set native_nftables: true in the plugin config, whose nftables backend runs no tool"
			if other := otherFlavour(mode); cfg.IptablesMode != iptables.ModeAuto {
				if _, err := iptables.NodeTools(view, other); err == nil {
					fix = fmt.Sprintf("the node has iptables-%s: set iptables_mode: %s (or leave it unset, to detect), or %s", other, other, fix)
				}
			}
			c.Problem = fmt.Errorf("%w: the plugin's iptables backend (%s) runs the node's iptables tools, and %w: %s",
				ErrNodeToolsMissing, settingOf(cfg, t), err, fix)
			return c
		default:
			c.Tools = &t
		}
		if len(t.Unsure) > 0 {
			c.NotChecked = append(c.NotChecked, "the kernel: not tried, the iptables flavour the plugin detects not known: it picks nft where iptables-nft-restore is installed, "+
				"and this agent found none where it sees the node, but cannot see "+strings.Join(t.Unsure, "; "))
			return c
		}
	default:
		c.Backend = "iptables"
		if mode != iptables.ModeAuto {
			c.Backend += "-" + string(mode)
		}
		c.NotChecked = append(c.NotChecked, "the node's iptables tools: not looked for, this agent sees nothing of the node's filesystem")
		if mode == iptables.ModeAuto {
			c.NotChecked = append(c.NotChecked, "the kernel: not tried, the iptables flavour the plugin detects from the node's tools not known")
			return c
		}
	}
	if missing := missingCaps(); missing != "" {
		c.NotChecked = append(c.NotChecked, "the kernel: not tried, writing a pod's rules in a throwaway network namespace takes CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW, and this agent lacks "+missing)
		return c
	}
	families := []redirect.Family{redirect.IPv4}
	if c.IPv6Skipped = nodeIPv6(); c.IPv6Skipped == "" {
		families = append(families, redirect.IPv6)
	}
	tried, err := probeKernel(ctx, cfg, mode, families)
	var unprobed *unprobedError
	switch {
	case errors.As(err, &unprobed):
		c.NotChecked = append(c.NotChecked, "the kernel: not tried, "+unprobed.Error())
	case err != nil:
		which := "a pod's rules"
		if len(tried) > 0 { // a dual-stack pod's, after the IPv4 pod's took
			which = "a dual-stack pod's IPv6 rules (it took an IPv4 pod's; the node has IPv6)"
		}
		c.Problem = fmt.Errorf("%w: the plugin's %s backend (%s) cannot write %s on this kernel (tried in a throwaway network namespace): %w: %s",
			ErrKernelRefused, c.Backend, settingOf(cfg, derefTools(c.Tools, mode)), which, err, kernelNeeds(cfg.Backend, mode))
	default:
		c.Families = tried
	}
	return c
}

func derefTools(t *iptables.Tools, mode iptables.Mode) iptables.Tools {
	if t != nil {
		return *t
	}
	return iptables.Tools{Mode: mode}
}

func otherFlavour(m iptables.Mode) iptables.Mode {
	if m == iptables.ModeNFT {
		return iptables.ModeLegacy
	}
	return iptables.ModeNFT
}

// settingOf names the plugin config's settings that chose the backend.
func settingOf(cfg *Config, t iptables.Tools) string {
	if cfg.Backend == BackendNftables {
		return "native_nftables: true"
	}
	if cfg.IptablesMode == iptables.ModeAuto {
		return fmt.Sprintf("native_nftables: false, iptables_mode unset: %s, as detected from the node's tools", t.Mode)
	}
	return fmt.Sprintf("native_nftables: false, iptables_mode: %s", cfg.IptablesMode)
}

// kernelNeeds names the kernel's part a backend's rules need.
func kernelNeeds(b Backend, mode iptables.Mode) string {
	switch {
	case b == BackendNftables:
		return "the kernel needs nf_tables (CONFIG_NF_TABLES, with nft_chain_nat, nft_redir, nft_ct and nft_socket, as modules or built in; for IPv6 pods CONFIG_NF_TABLES_IPV6)"
	case mode == iptables.ModeNFT:
		return "iptables-nft needs the kernel's nf_tables with its xtables compatibility (CONFIG_NF_TABLES, CONFIG_NFT_COMPAT, nft_chain_nat, and the xt_ matches and targets the rules use; for IPv6 pods CONFIG_NF_TABLES_IPV6): " +
			"a kernel without it runs iptables-legacy, iptables_mode: legacy, where it has ip_tables and the node iptables-legacy"
	default:
		return "iptables-legacy needs the kernel's ip_tables (CONFIG_IP_NF_IPTABLES, iptable_nat, iptable_mangle, and the xt_ matches and targets the rules use; for IPv6 pods ip6_tables, ip6table_nat and ip6table_mangle): " +
			"a kernel without it (some build only nf_tables) runs iptables-nft or nftables, native_nftables: true"
	}
}

// nodeIPv6 says why this thread's network namespace (the agent's, on the host
// network: the node's) does not use IPv6, "" when it does: an interface holds
// an IPv6 address beyond loopback and link-local. A node with IPv6 off
// (ipv6.disable=1, net.ipv6.conf.all.disable_ipv6=1) or unused starts no IPv6
// pod, and its kernel's IPv6 tables are not tried: their absence is no problem
// there.
func nodeIPv6() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Sprintf("the node's addresses could not be read: %v", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() == nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ""
		}
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		return "the node's kernel has IPv6 off (no /proc/sys/net/ipv6: ipv6.disable=1, or built without it)"
	}
	return "the node has no IPv6 address beyond loopback and link-local (IPv6 disabled or unused)"
}

// unprobedError says the kernel probe could not be made (not a kernel's refusal).
type unprobedError struct{ why string }

func (e *unprobedError) Error() string { return e.why }

// familyError is a probe's failure in one family.
type familyError struct {
	family redirect.Family
	err    error
}

func (e *familyError) Error() string { return e.err.Error() }
func (e *familyError) Unwrap() error { return e.err }

// probePlan is the probe's pod: Istio's default sidecar capture, every port
// captured in and out, with IPv6 (a dual-stack pod's rules) or without.
func probePlan(ipv6 bool) (*redirect.Plan, error) {
	spec := redirect.DefaultSpec()
	spec.InboundPorts.All = true
	spec.OutboundCIDRs.All = true
	spec.IPv6 = ipv6
	return redirect.Build(spec)
}

// probeKernel writes, with the backend cfg names (mode: the flavour the node's
// plugin uses), the probe pod's rules in a throwaway network namespace of
// their own for each of families in turn, IPv4 first (an IPv4 pod's rules,
// then a dual-stack pod's), within KernelProbeBound, and returns the families
// the kernel took; a refusal is a *familyError naming the family.
func probeKernel(ctx context.Context, cfg *Config, mode iptables.Mode, families []redirect.Family) (tried []redirect.Family, err error) {
	ctx, cancel := context.WithTimeout(ctx, KernelProbeBound)
	defer cancel()
	var b capture.Backend
	cleanup := func() {}
	if cfg.Backend == BackendNftables {
		b = nftables.NewBackend()
	} else {
		// Its locks in a directory of its own, in the plugin's lock dir (the
		// agent's root filesystem may be read-only, the run dir is the node's and
		// writable), held (livetemp) until the probe's last tool has ended and
		// the directory is gone: an agent killed meanwhile leaves it unlocked,
		// and the next agent's start removes it (RemoveAbandonedProbeDirs).
		xtables := filepath.Join(cfg.AgentRunDir, XtablesDirName)
		if err := os.MkdirAll(xtables, 0o755); err != nil {
			return nil, &unprobedError{fmt.Sprintf("a directory for the probe's locks: %v", err)}
		}
		dir, release, err := livetemp.MkdirTemp(xtables, ProbeDirPrefix)
		if err != nil {
			return nil, &unprobedError{fmt.Sprintf("a directory for the probe's locks: %v", err)}
		}
		ib, err := iptables.NewBackend(iptables.Config{Mode: mode, LockDir: dir})
		if err != nil {
			os.RemoveAll(dir)
			release()
			return nil, &unprobedError{fmt.Sprintf("this agent's image lacks the tools to try it: %v", err)}
		}
		b = ib
		cleanup = func() {
			os.RemoveAll(dir)
			release()
		}
	}
	type result struct {
		family redirect.Family
		err    error
	}
	results := make(chan result, len(families)) // never blocks the probe after a timeout
	go func() {
		// The directory goes after the last tool has ended: one that outlives the
		// bound is killed with ctx, which this function's return cancels.
		defer cleanup()
		for _, f := range families {
			plan, err := probePlan(f == redirect.IPv6)
			if err != nil {
				results <- result{f, &unprobedError{fmt.Sprintf("the probe's plan: %v", err)}}
				return
			}
			err = netns.InThrowaway(func() error {
				_, err := b.Apply(ctx, plan)
				return err
			})
			if errors.Is(err, netns.ErrNoThrowaway) {
				err = &unprobedError{err.Error()}
			}
			results <- result{f, err}
			if err != nil {
				return
			}
		}
	}()
	for range families {
		select {
		case r := <-results:
			var unprobed *unprobedError
			switch {
			case errors.As(r.err, &unprobed):
				return tried, unprobed
			case r.err != nil:
				return tried, &familyError{r.family, r.err}
			}
			tried = append(tried, r.family)
		case <-ctx.Done():
			return tried, &familyError{families[len(tried)], fmt.Errorf("no answer within %s (KernelProbeBound): %w", KernelProbeBound, ctx.Err())}
		}
	}
	return tried, nil
}

// RemoveAbandonedProbeDirs removes from the plugin's xtables directory in
// runDir the lock directories of kernel probes that a killed agent left
// (ProbeDirPrefix), never one a live probe holds (livetemp: another agent's,
// during a rolling update), and returns how many it removed. An agent's start
// runs it.
func RemoveAbandonedProbeDirs(runDir string) (removed int) {
	dir := filepath.Join(runDir, XtablesDirName)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), ProbeDirPrefix) {
			if ok, _ := livetemp.RemoveAbandoned(filepath.Join(dir, e.Name())); ok {
				removed++
			}
		}
	}
	return removed
}

// missingCaps names the capabilities the probe needs that this process lacks
// (CAP_SYS_ADMIN to make the namespace, CAP_NET_ADMIN to write its rules,
// CAP_NET_RAW for legacy iptables' socket), "" when it has them all.
func missingCaps() string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "" // let the probe say what fails
	}
	for _, line := range strings.Split(string(status), "\n") {
		v, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return ""
		}
		var missing []string
		for _, c := range []struct {
			bit  uint
			name string
		}{{21, "CAP_SYS_ADMIN"}, {12, "CAP_NET_ADMIN"}, {13, "CAP_NET_RAW"}} {
			if eff&(1<<c.bit) == 0 {
				missing = append(missing, c.name)
			}
		}
		if len(missing) > 1 {
			return strings.Join(missing[:len(missing)-1], ", ") + " and " + missing[len(missing)-1]
		}
		return strings.Join(missing, "")
	}
	return ""
}
