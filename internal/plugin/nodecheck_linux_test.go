//go:build !unitonly

package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/noderoot"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// CheckNode judges the node's tools with the plugin's own choice of them, in
// the view of the node's filesystem the agent has (all of it through its /proc,
// only its /usr, /sbin and /bin as the default chart mounts them, or nothing),
// and its kernel by writing a pod's rules in a throwaway namespace with the
// backend's own code (this kernel runs every backend); what is missing is named
// with the setting that asks for it, and what cannot be seen is said, never
// counted missing.
func TestCheckNodeNamesWhatTheNodeLacksForThePluginsBackend(t *testing.T) {
	root.Require(t)
	whole := func(fs noderoot.FS) func(t *testing.T) iptables.NodeView {
		return func(t *testing.T) iptables.NodeView { return iptables.NodeView{Root: fs.Make(t)} }
	}
	mounted := func(fs noderoot.FS) func(t *testing.T) iptables.NodeView {
		return func(t *testing.T) iptables.NodeView {
			return iptables.NodeView{Root: fs.Mounted(iptables.NodePathDirs...).Make(t), Dirs: iptables.NodePathDirs}
		}
	}
	legacyOnly := noderoot.FS{Files: map[string]os.FileMode{"usr/sbin/xtables-legacy-multi": 0o755}, Links: map[string]string{
		"usr/sbin/iptables-legacy-save": "xtables-legacy-multi", "usr/sbin/iptables-legacy-restore": "xtables-legacy-multi",
		"usr/sbin/ip6tables-legacy-save": "xtables-legacy-multi", "usr/sbin/ip6tables-legacy-restore": "xtables-legacy-multi"}}
	// Fedora CoreOS and RHCOS: /usr/local is a link to /var/usrlocal, outside
	// the node's /usr, /sbin and /bin.
	usrLocalInVar := func(fs noderoot.FS) noderoot.FS {
		fs.Links["usr/local"] = "../var/usrlocal"
		return fs
	}
	nothingInstalled := noderoot.Minimal()
	nothingInstalled.Links = map[string]string{}
	for _, tc := range []struct {
		name           string
		cfg            Config
		view           func(t *testing.T) iptables.NodeView
		backend        string
		tools          string // the IPv4 restore the plugin runs, when known
		problem        error
		problemSays    []string
		notCheckedSays []string
	}{
		{name: "native nftables: the kernel is tried", cfg: Config{Backend: BackendNftables}, view: whole(noderoot.Minimal()), backend: "nftables"},
		{name: "auto on Debian: nft, and this kernel runs it", view: whole(noderoot.Debian("legacy")), backend: "iptables-nft", tools: "/usr/sbin/iptables-nft-restore"},
		{name: "legacy on Debian: this kernel runs it", cfg: Config{IptablesMode: iptables.ModeLegacy}, view: whole(noderoot.Debian("legacy")), backend: "iptables-legacy",
			tools: "/usr/sbin/iptables-legacy-restore"},
		{name: "auto on a node without iptables", view: whole(noderoot.Minimal()), backend: "iptables-legacy", problem: ErrNodeToolsMissing, problemSays: []string{
			"native_nftables: false, iptables_mode unset: legacy, as detected from the node's tools",
			"runs the node's iptables tools, and found no iptables-legacy-save and iptables-legacy-restore (or iptables-save and iptables-restore), nor ip6tables-legacy-save",
			"in /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin of the node (seen at ",
			"set native_nftables: true"}},
		{name: "nft asked for on a legacy-only node", cfg: Config{IptablesMode: iptables.ModeNFT}, view: whole(legacyOnly), backend: "iptables-nft",
			problem: ErrNodeToolsMissing, problemSays: []string{"native_nftables: false, iptables_mode: nft", "iptables-nft-save and iptables-nft-restore",
				"the node has iptables-legacy: set iptables_mode: legacy (or leave it unset, to detect)"}},
		{name: "the node's /usr, /sbin and /bin alone: Debian's tools found, the kernel tried", view: mounted(noderoot.Debian("nft")), backend: "iptables-nft",
			tools: "/usr/sbin/iptables-nft-restore"},
		{name: "the node's /usr, /sbin and /bin alone: a node without iptables", view: mounted(noderoot.Minimal()), backend: "iptables-legacy",
			problem: ErrNodeToolsMissing, problemSays: []string{"found no iptables-legacy-save",
				"of the node (its /usr, /sbin, /bin seen at "}},
		{name: "the node's /usr, /sbin and /bin alone: none found, /usr/local not seen", view: mounted(usrLocalInVar(nothingInstalled)), backend: "iptables-legacy",
			notCheckedSays: []string{"the node's iptables tools: none of them found where this agent sees the node, and they may be where it does not: found no iptables-legacy-save",
				"the kernel: not tried, the iptables flavour the plugin detects from the node's tools not known"}},
		{name: "the node's /usr, /sbin and /bin alone: legacy asked for, none found, /usr/local not seen: the kernel is still tried", cfg: Config{IptablesMode: iptables.ModeLegacy},
			view: mounted(usrLocalInVar(nothingInstalled)), backend: "iptables-legacy",
			notCheckedSays: []string{"the node's iptables tools: none of them found where this agent sees the node, and they may be where it does not: found no iptables-legacy-save"}},
		{name: "the node's /usr, /sbin and /bin alone: legacy found, nft may be in the /usr/local not seen", view: mounted(usrLocalInVar(legacyOnly)), backend: "iptables-legacy",
			tools: "/usr/sbin/iptables-legacy-restore", notCheckedSays: []string{"the kernel: not tried, the iptables flavour the plugin detects not known: it picks nft where iptables-nft-restore is installed, " +
				"and this agent found none where it sees the node, but cannot see /usr/local/sbin: it leads to /var/usrlocal/sbin"}},
		{name: "auto, the node not visible", view: func(*testing.T) iptables.NodeView { return iptables.NodeView{} }, backend: "iptables", notCheckedSays: []string{
			"the node's iptables tools: not looked for, this agent sees nothing of the node's filesystem", "the kernel: not tried, the iptables flavour the plugin detects from the node's tools not known"}},
		{name: "legacy, the node not visible: the kernel is still tried", cfg: Config{IptablesMode: iptables.ModeLegacy}, view: func(*testing.T) iptables.NodeView { return iptables.NodeView{} },
			backend: "iptables-legacy", notCheckedSays: []string{"the node's iptables tools: not looked for, this agent sees nothing of the node's filesystem"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := istioRulesOfThisNamespace(t)
			tc.cfg.AgentRunDir = t.TempDir()
			c := CheckNode(context.Background(), &tc.cfg, tc.view(t))
			if c.Backend != tc.backend {
				t.Errorf("Backend = %q, want %q", c.Backend, tc.backend)
			}
			if tc.tools != "" && (c.Tools == nil || c.Tools.Restore[redirect.IPv4] != tc.tools) {
				t.Errorf("Tools = %+v, want the IPv4 restore %s", c.Tools, tc.tools)
			}
			if !errors.Is(c.Problem, tc.problem) || (tc.problem == nil) != (c.Problem == nil) {
				t.Fatalf("Problem = %v, want %v", c.Problem, tc.problem)
			}
			for _, s := range tc.problemSays {
				if !strings.Contains(c.Problem.Error(), s) {
					t.Errorf("Problem %q does not say %q", c.Problem, s)
				}
			}
			if len(c.NotChecked) != len(tc.notCheckedSays) {
				t.Fatalf("NotChecked = %q, want %d entries", c.NotChecked, len(tc.notCheckedSays))
			}
			for i, s := range tc.notCheckedSays {
				if !strings.HasPrefix(c.NotChecked[i], s) {
					t.Errorf("NotChecked[%d] = %q, want it to start %q", i, c.NotChecked[i], s)
				}
			}
			if tc.problem == nil && len(tc.notCheckedSays) == 0 && len(c.Families) == 0 {
				t.Errorf("Families = %v, want the kernel tried", c.Families)
			}
			waitProbeDirsGone(t, tc.cfg.AgentRunDir)
			if diff := cmp.Diff(before, istioRulesOfThisNamespace(t)); diff != "" {
				t.Errorf("the probe wrote rules in the test's own network namespace (-before +after):\n%s", diff)
			}
		})
	}
}

// waitProbeDirsGone waits for the kernel probe's lock directory to be removed
// (after its last tool has ended, on a goroutine of its own) and fails the test
// when something else is left in the plugin's lock dir.
func waitProbeDirsGone(t *testing.T, runDir string) {
	t.Helper()
	dir := filepath.Join(runDir, XtablesDirName)
	var left []os.DirEntry
	for range 100 {
		if left, _ = os.ReadDir(dir); len(left) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("the probe left %d files in the plugin's lock dir, %s first", len(left), left[0].Name())
}

// The probe tries IPv6 where the node has it (an IPv6 address beyond loopback
// and link-local in the agent's network namespace, the node's): a kernel that
// takes a pod's IPv4 rules and refuses a dual-stack pod's IPv6 ones (here
// ip6tables-legacy-restore's own words for a kernel without ip6_tables, from a
// stand-in first in PATH) is named with the family; a node with IPv6 disabled,
// or without an IPv6 address, is not held to it: IPv4 alone is tried, and it
// says why.
func TestCheckNodeTriesIPv6WhereTheNodeHasIt(t *testing.T) {
	root.Require(t)
	bin := t.TempDir()
	script := "#!/bin/sh\necho \"ip6tables-legacy-restore v1.8.9 (legacy): can't initialize ip6tables table \\`nat': Table does not exist (do you need to insmod?)\" >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "ip6tables-legacy-restore"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	nsDir := t.TempDir()
	for _, tc := range []struct {
		name         string
		setUp        []string // ip commands in the namespace, the agent's (the node's)
		problem      bool
		families     []redirect.Family
		skippedStart string
	}{
		{"an IPv6 address: IPv6 tried, refused", []string{"addr add fd00:10::1/128 dev lo"}, true, nil, ""},
		{"loopback and link-local only: IPv4 alone", nil, false, []redirect.Family{redirect.IPv4},
			"the node has no IPv6 address beyond loopback and link-local (IPv6 disabled or unused)"},
		{"IPv6 disabled (net.ipv6.conf.all.disable_ipv6=1): IPv4 alone", []string{"addr add fd00:10::1/128 dev lo", "sysctl"}, false, []redirect.Family{redirect.IPv4},
			"the node has no IPv6 address beyond loopback and link-local (IPv6 disabled or unused)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := testns.New(nsDir, fmt.Sprintf("node-%d", len(tc.name)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { testns.Delete(ns) })
			cfg := Config{IptablesMode: iptables.ModeLegacy, AgentRunDir: t.TempDir()}
			var c NodeCheck
			if err := netns.Do(ns, func() error {
				for _, cmd := range tc.setUp {
					if cmd == "sysctl" {
						for _, dev := range []string{"all", "default", "lo"} {
							if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0o644); err != nil {
								return err
							}
						}
						continue
					}
					if out, err := exec.Command("ip", strings.Fields(cmd)...).CombinedOutput(); err != nil {
						return fmt.Errorf("ip %s: %v: %s", cmd, err, out)
					}
				}
				c = CheckNode(context.Background(), &cfg, iptables.NodeView{Root: noderoot.Debian("legacy").Make(t)})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if tc.problem {
				if !errors.Is(c.Problem, ErrKernelRefused) {
					t.Fatalf("Problem = %v, want ErrKernelRefused", c.Problem)
				}
				for _, s := range []string{"cannot write a dual-stack pod's IPv6 rules (it took an IPv4 pod's; the node has IPv6) on this kernel", "Table does not exist",
					"for IPv6 pods ip6_tables, ip6table_nat and ip6table_mangle"} {
					if !strings.Contains(c.Problem.Error(), s) {
						t.Errorf("Problem %q does not say %q", c.Problem, s)
					}
				}
				return
			}
			if c.Problem != nil || len(c.NotChecked) > 0 {
				t.Fatalf("Problem = %v, NotChecked = %q, want neither", c.Problem, c.NotChecked)
			}
			if diff := cmp.Diff(tc.families, c.Families); diff != "" {
				t.Errorf("Families (-want +got):\n%s", diff)
			}
			if c.IPv6Skipped != tc.skippedStart {
				t.Errorf("IPv6Skipped = %q, want %q", c.IPv6Skipped, tc.skippedStart)
			}
		})
	}
}

// A kernel that refuses the flavour's tables (here legacy iptables' own words
// for a kernel without ip_tables, from a stand-in tool first in PATH: no kernel
// module can be taken away from this one) is named as the kernel's, with what
// the flavour needs.
func TestCheckNodeNamesAKernelThatRefusesTheFlavour(t *testing.T) {
	root.Require(t)
	bin := t.TempDir()
	for _, name := range []string{"iptables-legacy-save", "iptables-legacy-restore", "ip6tables-legacy-save", "ip6tables-legacy-restore"} {
		script := "#!/bin/sh\necho \"" + name + " v1.8.9 (legacy): can't initialize iptables table \\`nat': Table does not exist (do you need to insmod?)\" >&2\nexit 1\n"
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	cfg := Config{IptablesMode: iptables.ModeLegacy, AgentRunDir: t.TempDir()}
	c := CheckNode(context.Background(), &cfg, iptables.NodeView{Root: noderoot.Debian("nft").Make(t)})
	if !errors.Is(c.Problem, ErrKernelRefused) {
		t.Fatalf("Problem = %v, want ErrKernelRefused", c.Problem)
	}
	for _, s := range []string{"the plugin's iptables-legacy backend (native_nftables: false, iptables_mode: legacy) cannot write a pod's rules on this kernel", "Table does not exist",
		"iptables-legacy needs the kernel's ip_tables (CONFIG_IP_NF_IPTABLES"} {
		if !strings.Contains(c.Problem.Error(), s) {
			t.Errorf("Problem %q does not say %q", c.Problem, s)
		}
	}
}

// A probe's lock directory that a killed agent left (no live probe holds its
// lock) goes at the next agent's start; one a live probe holds (another
// agent's, during a rolling update: here a probe whose iptables-legacy-restore,
// a stand-in first in PATH, hangs) stays, and goes with the probe.
func TestRemoveAbandonedProbeDirsLeavesALiveProbesDir(t *testing.T) {
	root.Require(t)
	runDir := t.TempDir()
	xtables := filepath.Join(runDir, XtablesDirName)
	killed := filepath.Join(xtables, ProbeDirPrefix+"killed")
	if err := os.MkdirAll(killed, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(xtables, "pod-lock-not-a-probe")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	pidFile := filepath.Join(bin, "pid")
	// It answers the backend's --version (asked under a bound of its own) and
	// hangs on the restore, which the probe's context ends.
	standIn := "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'iptables-legacy-restore v1.8.9 (legacy)'; exit 0; }\necho $$ > " + pidFile + "\nexec sleep 30\n"
	if err := os.WriteFile(filepath.Join(bin, "iptables-legacy-restore"), []byte(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan NodeCheck, 1)
	t.Cleanup(func() {
		// Whatever failed: the probe ends, and so does its tool, before the test.
		cancel()
		<-done
		pid, err := os.ReadFile(pidFile)
		if err != nil {
			return
		}
		proc := "/proc/" + strings.TrimSpace(string(pid))
		for range 200 {
			if _, err := os.Stat(proc); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("the probe's tool (%s) outlived the probe", proc)
	})
	go func() {
		done <- CheckNode(ctx, &Config{IptablesMode: iptables.ModeLegacy, AgentRunDir: runDir}, iptables.NodeView{Root: noderoot.Debian("legacy").Make(t)})
	}()
	var live []string
	for range 500 {
		live, _ = filepath.Glob(filepath.Join(xtables, ProbeDirPrefix+"[^k]*"))
		if _, err := os.Stat(pidFile); err == nil && len(live) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(live) != 1 {
		t.Fatalf("no live probe's directory in %s", xtables)
	}

	if got := RemoveAbandonedProbeDirs(runDir); got != 1 {
		t.Errorf("removed %d, want 1", got)
	}
	for path, want := range map[string]bool{killed: false, live[0]: true, other: true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s there: %v, want %v", path, err == nil, want)
		}
	}
	cancel()
	for range 500 {
		if _, err := os.Stat(live[0]); os.IsNotExist(err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%s is left after its probe ended", live[0])
}

// istioRulesOfThisNamespace is every line of this process's network namespace's
// rules that names Istio's chains or our tables, in the three ways they are
// written.
func istioRulesOfThisNamespace(t *testing.T) []string {
	t.Helper()
	var lines []string
	for _, cmd := range [][]string{{"iptables-nft-save"}, {"iptables-legacy-save"}, {"nft", "list", "ruleset"}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(cmd, " "), err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(strings.ToLower(l), "istio") {
				lines = append(lines, cmd[0]+": "+l)
			}
		}
	}
	return lines
}
