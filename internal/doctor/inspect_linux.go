package doctor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Verdicts of an inspection, in JSON and in the exit code.
const (
	// StatusOK: the pod is redirected and its live rules are exactly the plan's.
	StatusOK = "ok"
	// StatusDifferent: the live rules differ from what the pod requires.
	StatusDifferent = "different"
	// StatusNotMeshed: the plugin does not redirect this pod (Decision says why).
	StatusNotMeshed = "not-meshed"
	// StatusFailed: the plugin's ADD fails for this pod (Error says why), or the
	// node's configuration keeps the plugin from running for it (Problems).
	StatusFailed = "failed"
)

// Inspection is the live state of a pod's redirection compared with what the
// plugin's own decision and plan require.
type Inspection struct {
	Pod      string          `json:"pod"`
	Node     string          `json:"node"`
	PodIPs   []string        `json:"podIPs"`
	Config   ConfigSource    `json:"config"`
	Decision plugin.Decision `json:"decision"`
	Capture  []string        `json:"capture,omitempty"`
	// Warnings are what the plugin's ADD warns of for the pod (see
	// Explanation.Warnings): the pod is captured, maybe not as its author meant.
	Warnings []string `json:"warnings,omitempty"`
	// Netns is where the pod's namespace was found (/proc/PID/ns/net or a bind mount).
	Netns      string `json:"netns"`
	NetnsInode uint64 `json:"netnsInode"`
	// Backend is the backend the config selects; Live holds the live rules of ours
	// per backend and family ("iptables ipv4", "nftables"), "" when there are none.
	Backend string            `json:"backend"`
	Live    map[string]string `json:"live"`
	// Differences are what is missing or extra in Backend's rules (plugin's CHECK);
	// Stray are rules of ours in the other backend, which nothing expects.
	Differences []string     `json:"differences"`
	Stray       []string     `json:"stray"`
	Multus      *MultusCheck `json:"multus,omitempty"`
	// Notes say what could not be checked where the doctor runs (missing tools).
	Notes []string `json:"notes,omitempty"`
	// Problems with the node or the pod that keep the plugin from doing its work.
	Problems []string `json:"problems,omitempty"`
	// Error is set when the plugin's ADD fails for this pod (a bad annotation).
	Error  string `json:"error,omitempty"`
	Status string `json:"status"`
}

// Inspect compares the live rules in pod's network namespace with what the plugin
// requires for it. podNS is the pod's Kubernetes namespace, nil when the caller did
// not look it up (it is needed only when it decides, see plugin.PlanFor). nsPath is
// the network namespace to enter (held open by the caller); where
// says, for people, where it was found.
// problems are found beforehand about the node (the plugin's binary) and Multus.
func Inspect(ctx context.Context, pod *kube.Pod, podNS *kube.Namespace, cfg *plugin.Config, src ConfigSource, multus *MultusCheck, problems []string, nsPath, where string, inode uint64) (*Inspection, error) {
	in := &Inspection{Pod: pod.Key(), Node: pod.Spec.NodeName, PodIPs: addrStrings(pod.IPs()), Config: src, Multus: multus,
		Netns: where, NetnsInode: inode, Live: map[string]string{}, Differences: []string{}, Stray: []string{}}
	in.Problems = append(append(in.Problems, src.Warnings...), problems...)
	if multus != nil {
		in.Problems = append(in.Problems, multus.Problems...)
	}

	// In the agent pod, read the iptables flavour the node's plugin writes (inspect
	// enters the pod's namespace, which troubleshooting's /host/proc mount comes with).
	cfg = plugin.ForNode(cfg, plugin.NodeViewIn(agentHostProcDir, ""))
	selected, other, notes, err := inspectBackends(cfg)
	if err != nil {
		return nil, err
	}
	in.Backend, in.Notes = selected.Name(), notes

	mode, err := liveIptablesMode(cfg)
	if err != nil {
		return nil, err
	}

	pp, perr := plugin.PlanFor(plugin.ArgsFor(pod), cfg, pod, podNS, sandboxOf(pod, nsPath, src.Layout))
	ex := explanation(pod, pp, perr, "iptables")
	in.Decision, in.Capture, in.Warnings, in.Error = ex.Decision, ex.Capture, ex.Warnings, ex.Error
	plan := pp.Plan
	// A pod the plugin does not redirect must hold no rules of ours: compare with
	// the empty plan.
	want := plan
	if want == nil {
		want = &redirect.Plan{}
	}
	// The rules shown, their differences and the stray rules are read under one
	// hold of the namespace's apply lock (capture.Read): all of one moment, never
	// an apply's half shown beside the differences of its end.
	err = capture.Read(ctx, nsPath, func(verify func(capture.Backend, *redirect.Plan) ([]string, error)) (err error) {
		if err := readLiveRules(ctx, nsPath, mode, in.Live); err != nil {
			return err
		}
		if in.Differences, err = verify(selected, want); err != nil {
			return err
		}
		if other != nil {
			in.Stray, err = verify(other, &redirect.Plan{})
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	in.Differences, in.Stray = nonNil(in.Differences), nonNil(in.Stray)
	switch {
	case in.Error != "" || len(in.Problems) > 0:
		in.Status = StatusFailed
	case len(in.Differences) > 0 || len(in.Stray) > 0:
		in.Status = StatusDifferent
	case in.Decision.Verdict != plugin.Redirect:
		in.Status = StatusNotMeshed
	default:
		in.Status = StatusOK
	}
	return in, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// inspectBackends returns the backend the config selects and the other one, to
// find stray rules. Where a backend's tools are missing (the agent image has them;
// a node or an image without them may not) nftables is read through netlink, and
// the iptables side is checked only as far as netlink shows it (see
// readLiveRules); notes say what was not checked.
func inspectBackends(cfg *plugin.Config) (selected, other capture.Backend, notes []string, err error) {
	nft := capture.Backend(netlinkBackend{})
	if haveNft() {
		nft = nftables.NewBackend()
	} else {
		notes = append(notes, netlinkNote)
	}
	if cfg.Backend == plugin.BackendNftables {
		if !haveIptablesSave() {
			notes = append(notes, "iptables-save is not in this image: stray iptables rules were looked for through netlink, "+
				"which shows iptables-nft's ISTIO chains but not iptables-legacy rules")
			return nft, iptablesNftChains{}, notes, nil
		}
		o := *cfg
		o.Backend = plugin.BackendIptables
		other, err = plugin.NewBackend(&o)
		return nft, other, notes, err
	}
	if !haveIptablesSave() {
		return nil, nil, nil, fmt.Errorf("the config selects the iptables backend (%s mode), and iptables-save is not in this image: "+
			"run istio-cni-doctor where the iptables tools are (the node itself, or the agent pod, whose image carries them), "+
			"or install with nativeNftables=true, whose tables can be read through netlink", cfg.IptablesMode)
	}
	selected, err = plugin.NewBackend(cfg)
	return selected, nft, notes, err
}

// liveIptablesMode is the iptables flavour whose rules readLiveRules reads: the
// one the config selects for its iptables backend.
func liveIptablesMode(cfg *plugin.Config) (iptables.Mode, error) {
	mode := iptables.ModeLegacy
	if haveIptablesSave() { // else no iptables rules are read
		o := *cfg
		o.Backend = plugin.BackendIptables
		b, err := plugin.NewBackend(&o)
		if err != nil {
			return "", err
		}
		if ib, ok := b.(*iptables.Backend); ok {
			mode = ib.Mode()
		}
	}
	return mode, nil
}

// readLiveRules reads our chains (iptables, in mode) and our tables (nftables)
// for people to read, in the calling thread's network namespace, the pod's at
// nsPath (capture.Read's fn).
func readLiveRules(ctx context.Context, nsPath string, mode iptables.Mode, out map[string]string) error {
	for _, fam := range []struct{ key, prefix string }{{"iptables ipv4", "iptables"}, {"iptables ipv6", "ip6tables"}} {
		bin := lookPath(fam.prefix+"-"+string(mode)+"-save", fam.prefix+"-save")
		if bin == "" {
			continue
		}
		text, err := runIn(ctx, bin)
		if err != nil {
			if fam.prefix == "ip6tables" {
				continue // a node without IPv6
			}
			return fmt.Errorf("read live rules in %s: %w", nsPath, err)
		}
		out[fam.key] = ourIptablesLines(text)
	}
	if !haveNft() {
		shapes, iptablesNft, err := readShapes()
		if err != nil {
			return fmt.Errorf("read live rules in %s through netlink: %w", nsPath, err)
		}
		text := shapesText(shapes)
		for _, c := range iptablesNft {
			text += c + " (iptables-nft)\n"
		}
		out["nftables (netlink)"] = text
	}
	if bin := lookPath("nft"); bin != "" {
		text, err := runIn(ctx, bin, "list", "tables")
		if err != nil {
			return fmt.Errorf("read live rules in %s: %w", nsPath, err)
		}
		var tables []string
		for _, l := range strings.Split(text, "\n") {
			f := strings.Fields(l)
			if len(f) == 3 && f[0] == "table" && strings.HasPrefix(f[2], nftables.TablePrefix) {
				t, err := runIn(ctx, bin, "list", "table", f[1], f[2])
				if err != nil {
					return fmt.Errorf("read live rules in %s: %w", nsPath, err)
				}
				tables = append(tables, t)
			}
		}
		sort.Strings(tables)
		out["nftables"] = strings.Join(tables, "")
	}
	return nil
}

func lookPath(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

func runIn(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The read-only save needs no lock; a private one keeps it off the node's.
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(os.TempDir(), "istio-cni-doctor.xtables.lock"))
	// A wrapper's child may hold the output after the tool is killed at the
	// --timeout: waited for as the plugin waits for its own tools.
	cmd.WaitDelay = iptables.RunWaitDelay
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ourIptablesLines keeps, from iptables-save output, our chains, their rules and
// the jumps into them, per table, without counters or timestamps.
func ourIptablesLines(save string) string {
	var b strings.Builder
	table := ""
	printed := ""
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "*"):
			table = l
			continue
		case strings.HasPrefix(l, ":ISTIO"):
			if i := strings.Index(l, " ["); i > 0 {
				l = l[:i]
			}
		case strings.HasPrefix(l, "-A ISTIO"), strings.HasPrefix(l, "-A ") && strings.Contains(l, " -j ISTIO"):
		default:
			continue
		}
		if printed != table {
			b.WriteString(table + "\n")
			printed = table
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

// Text renders an inspection for people.
func (in *Inspection) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Pod %s on node %s (%s)\n", in.Pod, in.Node, strings.Join(in.PodIPs, ", "))
	fmt.Fprintf(&b, "Config: %s (%s", in.Config.Path, in.Config.Layout)
	if len(in.Config.Chain) > 0 {
		fmt.Fprintf(&b, ": %s", strings.Join(in.Config.Chain, " -> "))
	}
	fmt.Fprintf(&b, "), backend %s\n", in.Backend)
	fmt.Fprintf(&b, "Network namespace: %s (inode %d)\n", in.Netns, in.NetnsInode)
	if decisionLine(&b, in.Decision, in.Error) {
		captureLines(&b, in.Capture, in.Warnings)
	}
	if in.Multus != nil {
		b.WriteString(in.Multus.Text())
	}
	keys := make([]string, 0, len(in.Live))
	for k := range in.Live {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if in.Live[k] == "" {
			fmt.Fprintf(&b, "\nLive rules (%s): none of ours\n", k)
		} else {
			fmt.Fprintf(&b, "\nLive rules (%s):\n%s", k, in.Live[k])
		}
	}
	b.WriteString("\n")
	for _, p := range in.Problems {
		fmt.Fprintf(&b, "PROBLEM: %s\n", p)
	}
	list := func(title string, items []string) {
		fmt.Fprintf(&b, "%s:\n", title)
		for _, d := range items {
			fmt.Fprintf(&b, "  - %s\n", d)
		}
	}
	redirected := in.Decision.Verdict == plugin.Redirect && in.Error == ""
	switch {
	case redirected && len(in.Differences) == 0:
		fmt.Fprintf(&b, "Rules: as the pod requires (%s).\n", in.Backend)
	case redirected:
		list(fmt.Sprintf("Rules: %d differences from what the pod requires (%s); the pod's traffic may bypass the sidecar, and the plugin's CHECK fails", len(in.Differences), in.Backend), in.Differences)
	case len(in.Differences) == 0:
		fmt.Fprintf(&b, "Rules: none of ours (%s), as expected for a pod the plugin does not redirect.\n", in.Backend)
	default:
		list(fmt.Sprintf("Rules: present although the plugin does not redirect this pod (%s)", in.Backend), in.Differences)
	}
	for _, n := range in.Notes {
		fmt.Fprintf(&b, "Note: %s\n", n)
	}
	if len(in.Stray) > 0 {
		list("Stray rules of the other backend (nothing expects them; the pod's traffic may be captured twice or inconsistently)", in.Stray)
	}
	fmt.Fprintf(&b, "Status: %s\n", in.Status)
	return b.String()
}

// Text renders the Multus checks.
func (m *MultusCheck) Text() string {
	var b strings.Builder
	switch {
	case m.Annotation == "":
		fmt.Fprintf(&b, "Multus: the pod has no %s annotation\n", MultusNetworksAnnotation)
	default:
		fmt.Fprintf(&b, "Multus: %s=%q", MultusNetworksAnnotation, m.Annotation)
		if m.Requested {
			fmt.Fprintf(&b, " requests %s", m.Network)
		}
		b.WriteString("\n")
	}
	if m.NADExists != nil && *m.NADExists {
		fmt.Fprintf(&b, "Multus: NetworkAttachmentDefinition %s/%s exists\n", m.NADNamespace, m.Network)
	}
	if m.Error != "" {
		fmt.Fprintf(&b, "Multus: %s\n", m.Error)
	}
	return b.String()
}

// sandboxOf is the pod's sandbox as the doctor plans it, at nsPath, with the
// addresses the plugin's own ADD and CHECK plan with in that layout:
//   - chained, the previous plugin's result, for which the pod's status addresses
//     stand in (their order does not matter: redirect.PodAddress takes IPv4 first
//     whatever the order, so the plan agrees with the ADD on containerd and CRI-O
//     alike);
//   - standalone (Multus), no previous result: the namespace's own addresses,
//     which PlanFor reads from nsPath, secondary networks' included.
//
// A pod whose status has no address yet is read from nsPath too.
func sandboxOf(pod *kube.Pod, nsPath, layout string) plugin.Sandbox {
	if layout == LayoutStandalone {
		return plugin.Sandbox{Netns: nsPath}
	}
	return plugin.Sandbox{Addrs: pod.IPs(), Netns: nsPath}
}
