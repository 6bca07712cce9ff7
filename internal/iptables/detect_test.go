package iptables

import (
	"os"
	"path/filepath"
	"testing"
)

// DetectMode on a node's filesystem seen from a container: it goes by the names
// installed in the runtime's PATH dirs, and a link counts even when its target
// (a path on the node, such as /etc/alternatives/...) does not resolve here.
func TestDetectModeOnAnotherRoot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		links map[string]string // path under root -> link target
		want  Mode
	}{
		{"nothing installed", nil, ModeLegacy},
		{"legacy only (iptables before 1.8)", map[string]string{"sbin/iptables-restore": "xtables-multi"}, ModeLegacy},
		{"both flavours, relative links", map[string]string{
			"usr/sbin/iptables-nft-restore": "xtables-nft-multi", "usr/sbin/iptables-legacy-restore": "xtables-legacy-multi"}, ModeNFT},
		{"nft through an absolute link that does not resolve here", map[string]string{
			"sbin/iptables-nft-restore": "/etc/alternatives/iptables-nft-restore"}, ModeNFT},
		{"a name outside the runtime's PATH does not count", map[string]string{"opt/bin/iptables-nft-restore": "x"}, ModeLegacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, target := range tc.links {
				if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
			if got := DetectMode(root); got != tc.want {
				t.Errorf("DetectMode = %q, want %q", got, tc.want)
			}
		})
	}
}
