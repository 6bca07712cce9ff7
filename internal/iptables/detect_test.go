package iptables

import (
	"errors"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/noderoot"
)

// DetectMode on a node's filesystem seen from a container: it goes by the names
// installed in the runtime's PATH dirs, following links as the node resolves
// them (an absolute target is a path on the node, not in the container).
func TestDetectModeOnAnotherRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		node noderoot.FS
		want Mode
	}{
		{"nothing installed", noderoot.FS{}, ModeLegacy},
		{"legacy only (iptables before 1.8)", noderoot.FS{Files: map[string]os.FileMode{"sbin/xtables-multi": 0o755},
			Links: map[string]string{"sbin/iptables-restore": "xtables-multi"}}, ModeLegacy},
		{"both flavours, relative links", noderoot.FS{Files: map[string]os.FileMode{"usr/sbin/xtables-nft-multi": 0o755, "usr/sbin/xtables-legacy-multi": 0o755},
			Links: map[string]string{"usr/sbin/iptables-nft-restore": "xtables-nft-multi", "usr/sbin/iptables-legacy-restore": "xtables-legacy-multi"}}, ModeNFT},
		{"Debian's alternatives, absolute links resolved in the node's root", noderoot.Debian("legacy"), ModeNFT},
		{"nft through an absolute link that dangles on the node", noderoot.FS{
			Links: map[string]string{"sbin/iptables-nft-restore": "/etc/alternatives/iptables-nft-restore"}}, ModeLegacy},
		{"a name outside the runtime's PATH does not count", noderoot.FS{Files: map[string]os.FileMode{"opt/bin/iptables-nft-restore": 0o755}}, ModeLegacy},
		{"a file that is not executable does not count", noderoot.FS{Files: map[string]os.FileMode{"usr/sbin/iptables-nft-restore": 0o644}}, ModeLegacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DetectMode(tc.node.Make(t)); got != tc.want {
				t.Errorf("DetectMode = %q, want %q", got, tc.want)
			}
		})
	}
}

// NodeTools is the plugin's choice of its tools on a node's root: the mode's own
// names, else the plain ones of iptables before 1.8, both families; what is
// missing is named with the directories searched.
func TestNodeToolsOnAnotherRoot(t *testing.T) {
	mergedUsr := noderoot.Debian("nft")
	mergedUsr.Links["sbin"] = "usr/sbin" // a merged /usr: /sbin is a link
	for _, tc := range []struct {
		name    string
		node    noderoot.FS
		mode    Mode
		want    Tools
		missing []string
	}{
		{"Debian, auto picks nft", noderoot.Debian("legacy"), ModeAuto, Tools{Mode: ModeNFT, Detected: true,
			Save:    map[redirect.Family]string{redirect.IPv4: "/usr/sbin/iptables-nft-save", redirect.IPv6: "/usr/sbin/ip6tables-nft-save"},
			Restore: map[redirect.Family]string{redirect.IPv4: "/usr/sbin/iptables-nft-restore", redirect.IPv6: "/usr/sbin/ip6tables-nft-restore"}}, nil},
		{"Debian, legacy asked for", mergedUsr, ModeLegacy, Tools{Mode: ModeLegacy,
			Save:    map[redirect.Family]string{redirect.IPv4: "/usr/sbin/iptables-legacy-save", redirect.IPv6: "/usr/sbin/ip6tables-legacy-save"},
			Restore: map[redirect.Family]string{redirect.IPv4: "/usr/sbin/iptables-legacy-restore", redirect.IPv6: "/usr/sbin/ip6tables-legacy-restore"}}, nil},
		{"iptables before 1.8: the plain names", noderoot.FS{Files: map[string]os.FileMode{"sbin/xtables-multi": 0o755}, Links: map[string]string{
			"sbin/iptables-save": "xtables-multi", "sbin/iptables-restore": "xtables-multi", "sbin/ip6tables-save": "/sbin/xtables-multi", "sbin/ip6tables-restore": "/sbin/xtables-multi"}},
			ModeAuto, Tools{Mode: ModeLegacy, Detected: true,
				Save:    map[redirect.Family]string{redirect.IPv4: "/sbin/iptables-save", redirect.IPv6: "/sbin/ip6tables-save"},
				Restore: map[redirect.Family]string{redirect.IPv4: "/sbin/iptables-restore", redirect.IPv6: "/sbin/ip6tables-restore"}}, nil},
		{"a minimal node OS without iptables", noderoot.Minimal(), ModeAuto,
			Tools{Mode: ModeLegacy, Detected: true},
			[]string{"iptables-legacy-save and iptables-legacy-restore (or iptables-save and iptables-restore)",
				"ip6tables-legacy-save and ip6tables-legacy-restore (or ip6tables-save and ip6tables-restore)"}},
		{"nft asked for, only legacy installed", noderoot.FS{Files: map[string]os.FileMode{"usr/sbin/xtables-legacy-multi": 0o755}, Links: map[string]string{
			"usr/sbin/iptables-legacy-save": "xtables-legacy-multi", "usr/sbin/iptables-legacy-restore": "xtables-legacy-multi",
			"usr/sbin/ip6tables-legacy-save": "xtables-legacy-multi", "usr/sbin/ip6tables-legacy-restore": "xtables-legacy-multi"}}, ModeNFT,
			Tools{Mode: ModeNFT},
			[]string{"iptables-nft-save and iptables-nft-restore (or iptables-save and iptables-restore)",
				"ip6tables-nft-save and ip6tables-nft-restore (or ip6tables-save and ip6tables-restore)"}},
		{"alternatives left dangling (the multi binary removed)", func() noderoot.FS {
			n := noderoot.Debian("nft")
			delete(n.Files, "usr/sbin/xtables-nft-multi")
			return n
		}(), ModeNFT, Tools{Mode: ModeNFT},
			[]string{"iptables-nft-save and iptables-nft-restore (or iptables-save and iptables-restore)",
				"ip6tables-nft-save and ip6tables-nft-restore (or ip6tables-save and ip6tables-restore)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := tc.node.Make(t)
			got, err := NodeTools(root, tc.mode)
			var missing *MissingToolsError
			if tc.missing == nil {
				if err != nil {
					t.Fatalf("NodeTools: %v", err)
				}
			} else if !errors.As(err, &missing) {
				t.Fatalf("NodeTools error = %v, want a *MissingToolsError", err)
			} else {
				if diff := cmp.Diff(tc.missing, missing.Missing); diff != "" {
					t.Errorf("missing (-want +got):\n%s", diff)
				}
				wantWhere := "/usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin of the node (seen at " + root + ")"
				if missing.Where != wantWhere {
					t.Errorf("where = %q, want %q", missing.Where, wantWhere)
				}
				tc.want.Save, tc.want.Restore = map[redirect.Family]string{}, map[redirect.Family]string{}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("NodeTools (-want +got):\n%s", diff)
			}
		})
	}
}

// Where openat2 is missing or refused (a kernel before 5.6, an older seccomp
// profile), the links are followed by hand: the same answer for every name of
// the fixtures above, Debian's absolute alternatives links included.
func TestToolsFoundWithoutOpenat2AsWithIt(t *testing.T) {
	mergedUsr := noderoot.Debian("legacy")
	mergedUsr.Links["sbin"] = "usr/sbin"
	dangling := noderoot.Debian("nft")
	delete(dangling.Files, "usr/sbin/xtables-nft-multi")
	for name, fs := range map[string]noderoot.FS{
		"Debian, nft":           noderoot.Debian("nft"),
		"merged /usr":           mergedUsr,
		"alternatives dangling": dangling,
		"minimal":               noderoot.Minimal(),
		"not executable":        {Files: map[string]os.FileMode{"usr/sbin/iptables-nft-restore": 0o644}},
	} {
		t.Run(name, func(t *testing.T) {
			root := fs.Make(t)
			found := 0
			for _, dir := range NodePath {
				for _, tool := range []string{"iptables", "ip6tables"} {
					for _, f := range []string{"-nft", "-legacy", ""} {
						for _, op := range []string{"", "-save", "-restore"} {
							p := dir + "/" + tool + f + op
							with, without := executableIn(root, p), executableFollowedIn(root, p)
							if with != without {
								t.Errorf("%s: with openat2 %v, without %v", p, with, without)
							}
							if with {
								found++
							}
						}
					}
				}
			}
			t.Logf("%d names found", found)
		})
	}
}
