package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
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

// CheckNode says whether the node can run the backend cfg gives the plugin: its
// tools, with the plugin's own choice of them (iptables.NodeTools in view, the
// node's filesystem as this process sees it: all of it, some of its
// directories, or nothing), and its kernel, by writing the rules of a pod of
// Istio's default sidecar capture (IPv4, every port in and out) in a throwaway
// network namespace (netns.InThrowaway) with the same backend code, within
// KernelProbeBound. In iptables mode the probe's tools are this process's (the
// agent's image carries both flavours), in the flavour the node's plugin picks:
// the node's kernel is what is tried. The node's own namespace is never
// touched. What cannot be seen is never counted missing: a tool that may be
// where the view does not reach is NotChecked. It runs nothing of the plugin's
// ADD, whose cost it leaves as it is: the agent runs it.
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
	err := probeKernel(ctx, cfg, mode)
	var unprobed *unprobedError
	switch {
	case errors.As(err, &unprobed):
		c.NotChecked = append(c.NotChecked, "the kernel: not tried, "+unprobed.Error())
	case err != nil:
		c.Problem = fmt.Errorf("%w: the plugin's %s backend (%s) cannot write a pod's rules on this kernel (tried in a throwaway network namespace): %w: %s",
			ErrKernelRefused, c.Backend, settingOf(cfg, derefTools(c.Tools, mode)), err, kernelNeeds(cfg.Backend, mode))
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
		return "the kernel needs nf_tables (CONFIG_NF_TABLES, with nft_chain_nat, nft_redir, nft_ct and nft_socket, as modules or built in)"
	case mode == iptables.ModeNFT:
		return "iptables-nft needs the kernel's nf_tables with its xtables compatibility (CONFIG_NF_TABLES, CONFIG_NFT_COMPAT, nft_chain_nat, and the xt_ matches and targets the rules use): " +
			"a kernel without it runs iptables-legacy, iptables_mode: legacy, where it has ip_tables and the node iptables-legacy"
	default:
		return "iptables-legacy needs the kernel's ip_tables (CONFIG_IP_NF_IPTABLES, iptable_nat, iptable_mangle, and the xt_ matches and targets the rules use): " +
			"a kernel without it (some build only nf_tables) runs iptables-nft or nftables, native_nftables: true"
	}
}

// unprobedError says the kernel probe could not be made (not a kernel's refusal).
type unprobedError struct{ why string }

func (e *unprobedError) Error() string { return e.why }

// probePlan is the probe's pod: Istio's default sidecar capture, IPv4 (a node
// with IPv6 off still runs IPv4 pods), every port captured in and out.
func probePlan() (*redirect.Plan, error) {
	spec := redirect.DefaultSpec()
	spec.InboundPorts.All = true
	spec.OutboundCIDRs.All = true
	return redirect.Build(spec)
}

// probeKernel writes probePlan's rules in a throwaway network namespace with the
// backend cfg names (mode: the flavour the node's plugin uses), within
// KernelProbeBound.
func probeKernel(ctx context.Context, cfg *Config, mode iptables.Mode) error {
	plan, err := probePlan()
	if err != nil {
		return &unprobedError{fmt.Sprintf("the probe's plan: %v", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, KernelProbeBound)
	defer cancel()
	var b capture.Backend
	if cfg.Backend == BackendNftables {
		b = nftables.NewBackend()
	} else {
		// Its locks in a directory of its own, removed after it, in the plugin's
		// lock dir (the agent's root filesystem may be read-only, the run dir is
		// the node's and writable).
		xtables := filepath.Join(cfg.AgentRunDir, XtablesDirName)
		if err := os.MkdirAll(xtables, 0o755); err != nil {
			return &unprobedError{fmt.Sprintf("a directory for the probe's locks: %v", err)}
		}
		dir, err := os.MkdirTemp(xtables, "node-check-")
		if err != nil {
			return &unprobedError{fmt.Sprintf("a directory for the probe's locks: %v", err)}
		}
		defer os.RemoveAll(dir)
		ib, err := iptables.NewBackend(iptables.Config{Mode: mode, LockDir: dir})
		if err != nil {
			return &unprobedError{fmt.Sprintf("this agent's image lacks the tools to try it: %v", err)}
		}
		b = ib
	}
	done := make(chan error, 1)
	go func() {
		done <- netns.InThrowaway(func() error {
			_, err := b.Apply(ctx, plan)
			return err
		})
	}()
	select {
	case err := <-done:
		if errors.Is(err, netns.ErrNoThrowaway) {
			return &unprobedError{err.Error()}
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s (KernelProbeBound): %w", KernelProbeBound, ctx.Err())
	}
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
