package agent

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// kernel for each backend and finds nothing missing on this kernel, which runs them all
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
			[]string{"node check: this node runs the plugin's rule backend", "backend=iptables-nft"}},
		{"repair in place, iptables legacy", netnsCaps, []string{"IPTABLES_MODE=legacy"},
			[]string{"node check: this node runs the plugin's rule backend", "backend=iptables-legacy"}},
		{"repair in place, native nftables", netnsCaps, []string{"NATIVE_NFTABLES=true"},
			[]string{"node check: this node runs the plugin's rule backend", "backend=nftables"}},
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
