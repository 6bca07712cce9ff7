package agent

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/test/harness/chartrender"
	"github.com/istio-cni/istio-cni/test/harness/noderoot"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// fakeProc is a node's /proc as the agent sees it mounted (REPAIR_PROC_DIR):
// PID 1's root is nodeRoot.
func fakeProc(t *testing.T, nodeRoot string) string {
	t.Helper()
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(nodeRoot, filepath.Join(proc, "1", "root")); err != nil {
		t.Fatal(err)
	}
	return proc
}

// On a node without the iptables tools the plugin's backend runs (a minimal node
// OS), the real agent installs the plugin but stays not ready, naming the
// setting and what is missing in /readyz and one error line, with
// istio_cni_plugin_backend_unusable 1; once the node has them, it sees so at its
// next check and is ready, the gauge 0. On a node that has them it is ready at
// once.
func TestAgentIsNotReadyOnANodeWithoutThePluginsTools(t *testing.T) {
	root.Require(t) // the kernel probe makes a network namespace
	t.Parallel()
	t.Run("tools missing, then installed", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		nodeRoot := noderoot.Minimal().Make(t)
		n.writeCalico(t)
		p := n.startAgent(t, "REPAIR_PROC_DIR="+fakeProc(t, nodeRoot))
		wantSays := []string{
			"this node cannot run the plugin's rule backend, so every meshed pod's ADD fails here",
			"native_nftables: false, iptables_mode unset: legacy, as detected from the node's tools",
			"runs the node's iptables tools, and found no iptables-legacy-save and iptables-legacy-restore (or iptables-save and iptables-restore), nor ip6tables-legacy-save and ip6tables-legacy-restore",
			"in /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin of the node",
		}
		var body string
		eventually(t, 10*time.Second, "/readyz names the missing tools and the setting", func() bool {
			var code int
			code, body = p.readyz()
			if code != http.StatusServiceUnavailable {
				return false
			}
			for _, s := range wantSays {
				if !strings.Contains(body, s) {
					return false
				}
			}
			return true
		})
		if strings.Contains(body, "does not hold the istio-cni entry") {
			t.Errorf("/readyz %q: the entry is installed all the same (pods fail closed, never start uncaptured)", body)
		}
		line := p.waitLog(t, "one error line naming the chart value", `.*this node cannot run the plugin's rule backend: every meshed pod's ADD fails here.*`)
		if !strings.Contains(line, "nativeNftables") {
			t.Errorf("error line %q does not name the chart value nativeNftables", line)
		}
		if got := p.metric(t, "istio_cni_plugin_backend_unusable"); got != 1 {
			t.Errorf("istio_cni_plugin_backend_unusable = %v, want 1", got)
		}
		if got := strings.Count(p.stderr.String(), "this node cannot run the plugin's rule backend: every"); got != 1 {
			t.Errorf("the problem was logged %d times, want once", got)
		}

		// The node's iptables package is installed: the next check finds it.
		debian := noderoot.Debian("nft").Make(t)
		if err := os.Remove(filepath.Join(p.procDir(t), "1", "root")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(debian, filepath.Join(p.procDir(t), "1", "root")); err != nil {
			t.Fatal(err)
		}
		eventually(t, 40*time.Second, "the agent is ready once the node has the tools", p.ready)
		if got := p.metric(t, "istio_cni_plugin_backend_unusable"); got != 0 {
			t.Errorf("istio_cni_plugin_backend_unusable = %v, want 0", got)
		}
		p.waitLog(t, "the recovery logged", `this node can run the plugin's rule backend now`)
	})
	t.Run("tools present", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		n.writeCalico(t)
		p := n.startAgent(t, "REPAIR_PROC_DIR="+fakeProc(t, noderoot.Debian("legacy").Make(t)))
		p.waitReady(t)
		line := p.waitLog(t, "the check's finding", `.*node check: this node runs the plugin's rule backend.*`)
		for _, s := range []string{"backend=iptables-nft", "detected=true", "/usr/sbin/iptables-nft-restore"} {
			if !strings.Contains(line, s) {
				t.Errorf("node check line %q does not say %q", line, s)
			}
		}
		if got := p.metric(t, "istio_cni_plugin_backend_unusable"); got != 0 {
			t.Errorf("istio_cni_plugin_backend_unusable = %v, want 0", got)
		}
		// Nothing was missing before: no recovery to speak of.
		if strings.Contains(p.stderr.String(), "can run the plugin's rule backend now") {
			t.Errorf("the first check's success was logged as a recovery:\n%s", p.stderr.String())
		}
	})
}

// procDir is the REPAIR_PROC_DIR the agent was started with.
func (p *agentProc) procDir(t *testing.T) string {
	t.Helper()
	for _, e := range p.cmd.Env {
		if v, ok := strings.CutPrefix(e, "REPAIR_PROC_DIR="); ok {
			return v
		}
	}
	t.Fatal("the agent was started without REPAIR_PROC_DIR")
	return ""
}

// The agent run with the chart's capabilities: with those repair in place and
// troubleshooting add (NET_ADMIN, NET_RAW, SYS_ADMIN, SYS_PTRACE) it tries the
// kernel for each backend, a dual-stack pod's rules too (this machine has an
// IPv6 address), and finds nothing missing on this kernel, which runs them all
// (no false refusal keeps a working node not ready); with the default set
// (DAC_OVERRIDE alone) it cannot make a namespace, says the kernel was not
// tried, why, and which chart values would let it, and is ready.
func TestTheNodeCheckWithTheChartsCapabilities(t *testing.T) {
	root.Require(t)
	t.Parallel()
	const netnsCaps = "-all,+dac_override,+net_admin,+net_raw,+sys_admin,+sys_ptrace"
	for _, tc := range []struct {
		name, caps string
		env        []string
		says       []string
	}{
		{"repair in place, iptables detected", netnsCaps, nil,
			[]string{"node check: this node runs the plugin's rule backend", "backend=iptables-nft", "kernel=\"took an IPv4 pod's rules and a dual-stack pod's\""}},
		{"repair in place, iptables legacy", netnsCaps, []string{"IPTABLES_MODE=legacy"},
			[]string{"node check: this node runs the plugin's rule backend", "backend=iptables-legacy"}},
		{"repair in place, native nftables", netnsCaps, []string{"NATIVE_NFTABLES=true"},
			[]string{"node check: this node runs the plugin's rule backend", "backend=nftables", "kernel=\"took an IPv4 pod's rules and a dual-stack pod's\""}},
		{"the default capabilities", "-all,+dac_override", nil,
			[]string{"node check: nothing missing for the plugin's rule backend in what this agent can check, the rest not checked", "backend=iptables-nft",
				"the kernel: not tried, writing a pod's rules in a throwaway network namespace takes CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW, and this agent lacks CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW",
				"hint=\"the chart mounts the node's /usr, /sbin and /bin read-only with nodeCheck.mountToolDirs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.writeCalico(t)
			wrapper := []string{"setpriv", "--bounding-set=" + tc.caps, "--inh-caps=" + tc.caps, "--"}
			p := n.startAgentVia(t, wrapper, append([]string{"REPAIR_PROC_DIR=" + fakeProc(t, noderoot.Debian("nft").Make(t))}, tc.env...)...)
			p.waitReady(t)
			line := p.waitLog(t, "the node check's finding", `.*node check: .*`)
			for _, s := range tc.says {
				if !strings.Contains(line, s) {
					t.Errorf("node check line %q does not say %q", line, s)
				}
			}
			if got := p.metric(t, "istio_cni_plugin_backend_unusable"); got != 0 {
				t.Errorf("istio_cni_plugin_backend_unusable = %v, want 0", got)
			}
		})
	}
}

// chartAgent is what the default chart's agent container may use of the node,
// as the reviewed render has it (chartrender: test/chart keeps it equal to
// helm's): its capabilities in setpriv's form, and the node's directories it
// mounts under NODE_DIRS_ROOT (host path -> mount path).
type chartAgent struct {
	caps     string
	dirsRoot string
	mounts   map[string]string
	readOnly bool
}

func defaultChartAgent(t *testing.T) chartAgent {
	t.Helper()
	render, err := chartrender.Load("default")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := render.DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	var c *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "install-cni" {
			c = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("%s: no install-cni container", render.Path)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || (sc.Privileged != nil && *sc.Privileged) {
		t.Fatalf("%s: the agent's securityContext %+v does not drop ALL unprivileged: this test's setpriv would not be the chart's", render.Path, sc)
	}
	a := chartAgent{caps: "-all", mounts: map[string]string{}, readOnly: true}
	for _, cap := range sc.Capabilities.Add {
		a.caps += ",+" + strings.ToLower(string(cap))
	}
	for _, e := range c.Env {
		if e.Name == "NODE_DIRS_ROOT" {
			a.dirsRoot = e.Value
		}
	}
	if a.dirsRoot == "" {
		a.dirsRoot = DefaultNodeDirsRoot
	}
	hostPaths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, vm := range c.VolumeMounts {
		if host, ok := hostPaths[vm.Name]; ok && slices.Contains(iptables.NodePathDirs, strings.TrimPrefix(vm.MountPath, a.dirsRoot)) {
			a.mounts[host] = vm.MountPath
			a.readOnly = a.readOnly && vm.ReadOnly
		}
	}
	return a
}

// With the default chart's mounts and capabilities (the reviewed render: the
// node's /usr, /sbin and /bin read-only under NODE_DIRS_ROOT, DAC_OVERRIDE
// alone, no /proc), the real agent, run in a mount namespace of its own where
// those host paths of a node's root are bind-mounted read-only at the render's
// mount paths (a merged /usr's /sbin link followed, as the runtime does), sees
// that a node without iptables lacks the plugin's tools: not ready, naming
// them, the gauge 1. On Debian's iptables it finds them, is ready, and says the
// kernel was not tried, why, and which values would let it.
func TestTheDefaultChartsAgentSeesANodeWithoutIptables(t *testing.T) {
	root.Require(t) // mounts
	t.Parallel()
	chart := defaultChartAgent(t)
	if len(chart.mounts) == 0 {
		t.Fatal("the default chart mounts none of the node's /usr, /sbin and /bin: the agent cannot see the node's tools")
	}
	if !chart.readOnly {
		t.Errorf("the default chart mounts the node's %v writable, want read-only", chart.mounts)
	}
	debian := noderoot.Debian("nft")
	debian.Links["sbin"] = "usr/sbin" // a merged /usr
	debian.Links["bin"] = "usr/bin"
	debian.Dirs = []string{"usr/bin"}
	minimal := noderoot.Minimal() // a node OS's own /sbin and /bin, without iptables
	minimal.Dirs = []string{"sbin", "bin", "usr/sbin"}
	for _, tc := range []struct {
		name  string
		node  noderoot.FS
		ready bool
		says  []string
	}{
		{"a node without iptables", minimal, false, []string{
			"this node cannot run the plugin's rule backend, so every meshed pod's ADD fails here",
			"found no iptables-legacy-save and iptables-legacy-restore (or iptables-save and iptables-restore), nor ip6tables-legacy-save",
			"of the node (its /usr, /sbin, /bin seen at "}},
		{"Debian's iptables, merged /usr", debian, true, []string{
			"node check: nothing missing for the plugin's rule backend in what this agent can check, the rest not checked",
			"backend=iptables-nft", "nodeDirs=/usr,/sbin,/bin", "/usr/sbin/iptables-nft-restore",
			"the kernel: not tried, writing a pod's rules in a throwaway network namespace takes CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_NET_RAW"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.writeCalico(t)
			nodeRoot := tc.node.Make(t)
			view := t.TempDir() // the container's NODE_DIRS_ROOT
			var script strings.Builder
			for _, host := range slices.Sorted(maps.Keys(chart.mounts)) {
				dst := filepath.Join(view, strings.TrimPrefix(chart.mounts[host], chart.dirsRoot))
				// As the kubelet (hostPath type Directory) and the runtime do: a
				// missing directory refuses the pod, a link is followed.
				src := filepath.Join(nodeRoot, host)
				fmt.Fprintf(&script, "test -d '%s' || { echo 'the node has no %s' >&2; exit 1; }\n", src, host)
				fmt.Fprintf(&script, "mkdir -p '%s' && mount --bind -o ro '%s' '%s' || exit 1\n", dst, src, dst)
			}
			script.WriteString(`exec setpriv --bounding-set="$CAPS" --inh-caps="$CAPS" -- "$@"` + "\n")
			wrapper := []string{"env", "CAPS=" + chart.caps, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script.String(), "sh"}
			p := n.startAgentVia(t, wrapper, "NODE_DIRS_ROOT="+view, "REPAIR_PROC_DIR="+t.TempDir()) // no /proc: the chart mounts none
			var body string
			eventually(t, 10*time.Second, "/readyz answers the node check's finding", func() bool {
				var code int
				code, body = p.readyz()
				return code == http.StatusOK || strings.Contains(body, "rule backend")
			})
			if tc.ready {
				p.waitReady(t)
				body = p.waitLog(t, "the check's finding", `.*node check: .*`)
			}
			for _, s := range tc.says {
				if !strings.Contains(body, s) {
					t.Errorf("%q does not say %q", body, s)
				}
			}
			want := 1.0
			if tc.ready {
				want = 0
			}
			if got := p.metric(t, "istio_cni_plugin_backend_unusable"); got != want {
				t.Errorf("istio_cni_plugin_backend_unusable = %v, want %v", got, want)
			}
		})
	}
}

// An agent killed in the middle of its node check's kernel probe (here its
// iptables-legacy-restore hangs, a stand-in first in PATH) leaves the probe's
// lock directory in the run dir's xtables/; the next agent's start removes it,
// and says so. (A live probe's, another agent's during a rolling update, stays:
// plugin's TestRemoveAbandonedProbeDirsLeavesALiveProbesDir.)
func TestAKilledAgentsProbeDirIsRemovedAtTheNextStart(t *testing.T) {
	root.Require(t)
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	bin := t.TempDir()
	pidFile := filepath.Join(bin, "pid")
	standIn := "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'iptables-legacy-restore v1.8.9 (legacy)'; exit 0; }\necho $$ > " + pidFile + "\nexec sleep 60\n"
	writeFile(t, filepath.Join(bin, "iptables-legacy-restore"), []byte(standIn), 0o755)
	proc := fakeProc(t, noderoot.Debian("legacy").Make(t))
	killed := n.startAgent(t, "PATH="+bin+":"+os.Getenv("PATH"), "IPTABLES_MODE=legacy", "REPAIR_PROC_DIR="+proc)
	var left []string
	eventually(t, 10*time.Second, "the probe's lock directory and its hanging tool", func() bool {
		left, _ = filepath.Glob(filepath.Join(n.runDir, "xtables", "node-check-*"))
		_, err := os.Stat(pidFile)
		return len(left) == 1 && err == nil
	})
	killed.kill()
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var toolPID int
	fmt.Sscan(string(pid), &toolPID)
	if err := syscall.Kill(toolPID, syscall.SIGKILL); err != nil {
		t.Fatalf("end the hanging tool %d: %v", toolPID, err)
	}
	if _, err := os.Stat(left[0]); err != nil {
		t.Fatalf("the killed agent's probe directory is gone before the next start: %v", err)
	}

	next := n.startAgent(t, "IPTABLES_MODE=legacy", "REPAIR_PROC_DIR="+proc)
	next.waitReady(t)
	next.waitLog(t, "the removal said", `removed the lock directories of node checks a killed agent left.*count=1`)
	if _, err := os.Stat(left[0]); !os.IsNotExist(err) {
		t.Errorf("%s is still there after the next agent's start (%v)", left[0], err)
	}
}
