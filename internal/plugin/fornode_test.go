package plugin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/istio-cni/istio-cni/internal/iptables"
)

// ForNode fills in the node's iptables flavour only where the config leaves it to
// detection, and only for the iptables backend.
func TestForNodeTakesTheNodesIptablesFlavour(t *testing.T) {
	nftNode := t.TempDir()
	if err := os.MkdirAll(filepath.Join(nftNode, "usr", "sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Found as the node's exec.LookPath would: a link to an executable file.
	if err := os.WriteFile(filepath.Join(nftNode, "usr", "sbin", "xtables-nft-multi"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("xtables-nft-multi", filepath.Join(nftNode, "usr", "sbin", "iptables-nft-restore")); err != nil {
		t.Fatal(err)
	}
	legacyNode := t.TempDir()
	for _, tc := range []struct {
		name    string
		cfg     Config
		root    string
		want    iptables.Mode
		wantCfg bool // the same *Config comes back
	}{
		{"detect on an nft node", Config{}, nftNode, iptables.ModeNFT, false},
		{"detect on a legacy node", Config{}, legacyNode, iptables.ModeLegacy, false},
		{"the config's flavour wins", Config{IptablesMode: iptables.ModeLegacy}, nftNode, iptables.ModeLegacy, true},
		{"native nftables has no flavour", Config{Backend: BackendNftables}, nftNode, iptables.ModeAuto, true},
		{"node not visible", Config{}, "", iptables.ModeAuto, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			got := ForNode(&cfg, iptables.NodeView{Root: tc.root})
			if got.IptablesMode != tc.want {
				t.Errorf("IptablesMode = %q, want %q", got.IptablesMode, tc.want)
			}
			if (got == &cfg) != tc.wantCfg {
				t.Errorf("returned the caller's config: %v, want %v", got == &cfg, tc.wantCfg)
			}
			if cfg.IptablesMode != tc.cfg.IptablesMode {
				t.Errorf("the caller's config was changed to %q", cfg.IptablesMode)
			}
		})
	}
	if got := NodeRootIn(t.TempDir()); got != "" {
		t.Errorf("NodeRootIn of a directory that is no /proc = %q, want \"\"", got)
	}
	// A fake /proc: PID 1's root unreadable (absent), a kubelet whose root is readable.
	proc := t.TempDir()
	node := t.TempDir()
	if err := os.MkdirAll(filepath.Join(node, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	for pid, comm := range map[string]string{"1": "systemd", "40": "bash", "77": "kubelet"} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(node, filepath.Join(proc, "77", "root")); err != nil {
		t.Fatal(err)
	}
	if got, want := NodeRootIn(proc), filepath.Join(proc, "77", "root"); got != want {
		t.Errorf("NodeRootIn with PID 1 unreadable = %q, want the kubelet's root %q", got, want)
	}
}
