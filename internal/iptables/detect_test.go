package iptables

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/noderoot"
	"github.com/istio-cni/istio-cni/test/harness/root"
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
		{"nft in a directory reached through an absolute link, resolved in the node's root", noderoot.FS{
			Files: map[string]os.FileMode{"opt/tools/sbin/xtables-nft-multi": 0o755},
			Links: map[string]string{"usr/local/sbin": "/opt/tools/sbin", "opt/tools/sbin/iptables-nft-restore": "xtables-nft-multi"}}, ModeNFT},
		// This process's own /usr/sbin has xtables-nft-multi (the image's, the
		// test machine's): followed in this filesystem, the link would count.
		{"an absolute link to what this process has and the node has not dangles", noderoot.FS{
			Links: map[string]string{"usr/sbin/iptables-nft-restore": "/usr/sbin/xtables-nft-multi"}}, ModeLegacy},
		{"a link loop does not count", noderoot.FS{
			Links: map[string]string{"usr/sbin/iptables-nft-restore": "iptables-nft-save", "usr/sbin/iptables-nft-save": "iptables-nft-restore"}}, ModeLegacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DetectMode(NodeView{Root: tc.node.Make(t)}); got != tc.want {
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
			got, err := NodeTools(NodeView{Root: root}, tc.mode)
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

// In a view of some of the node's directories (the chart's read-only mounts of
// its /usr, /sbin and /bin under /host, made here as a bind mount shows them: a
// directory that is a link on the node shows its target's content), the tools
// are found as in the whole node where they resolve within those directories; a
// directory or name that leads outside them is neither found nor missing but
// unseen, named with where it leads, so that what cannot be seen never counts
// as missing.
func TestNodeToolsInAViewOfTheNodesPathDirs(t *testing.T) {
	mergedUsr := noderoot.Debian("nft")
	mergedUsr.Links["sbin"] = "usr/sbin"
	mergedUsr.Links["bin"] = "usr/bin"
	cos := noderoot.FS{Files: map[string]os.FileMode{"sbin/xtables-legacy-multi": 0o755}, Links: map[string]string{}}
	for _, p := range []string{"iptables", "ip6tables"} {
		for _, op := range []string{"-save", "-restore"} {
			cos.Links["sbin/"+p+"-legacy"+op] = "xtables-legacy-multi"
		}
	}
	// Fedora CoreOS and RHCOS: /usr/local is a link to /var/usrlocal.
	usrLocalInVar := noderoot.FS{Files: map[string]os.FileMode{"var/usrlocal/sbin/xtables-nft-multi": 0o755}, Links: map[string]string{"usr/local": "../var/usrlocal"}}
	for _, p := range []string{"iptables", "ip6tables"} {
		for _, op := range []string{"-save", "-restore"} {
			usrLocalInVar.Links["var/usrlocal/sbin/"+p+"-nft"+op] = "xtables-nft-multi"
		}
	}
	// Only the plain names, each through /etc/alternatives.
	plainOnly := noderoot.Debian("nft")
	for p := range plainOnly.Links {
		if strings.Contains(p, "-nft") || strings.Contains(p, "-legacy") {
			delete(plainOnly.Links, p)
		}
	}
	for _, tc := range []struct {
		name     string
		node     noderoot.FS
		mode     Mode
		restore4 string   // the IPv4 restore found; "" when missing
		unsure   []string // Tools.Unsure, each entry's start
		unseen   []string // MissingToolsError.Unseen, each entry's start
	}{
		{name: "Debian, merged /usr: nft detected, found through the relative links", node: mergedUsr, mode: ModeAuto, restore4: "/usr/sbin/iptables-nft-restore"},
		{name: "COS-like: legacy in a /sbin of its own", node: cos, mode: ModeAuto, restore4: "/sbin/iptables-legacy-restore"},
		{name: "a minimal node: missing, nothing unseen", node: noderoot.Minimal(), mode: ModeAuto},
		{name: "/usr/local leads to /var: unseen, not missing", node: usrLocalInVar, mode: ModeAuto,
			unsure: []string{"/usr/local/sbin: it leads to /var/usrlocal/sbin, outside what this process sees of the node",
				"/usr/local/bin: it leads to /var/usrlocal/bin"},
			unseen: []string{"/usr/local/sbin: it leads to /var/usrlocal/sbin", "/usr/local/bin: it leads to /var/usrlocal/bin"}},
		{name: "only plain names, through /etc/alternatives: unseen, not missing", node: plainOnly, mode: ModeNFT,
			unseen: []string{"/usr/sbin/iptables-save: it leads to /etc/alternatives/iptables-save", "/usr/sbin/iptables-restore: it leads to /etc/alternatives/iptables-restore"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			view := NodeView{Root: tc.node.Mounted(NodePathDirs...).Make(t), Dirs: NodePathDirs}
			got, err := NodeTools(view, tc.mode)
			if len(got.Unsure) != len(tc.unsure) {
				t.Errorf("Unsure = %q, want %d entries", got.Unsure, len(tc.unsure))
			}
			for i := range min(len(got.Unsure), len(tc.unsure)) {
				if !strings.HasPrefix(got.Unsure[i], tc.unsure[i]) {
					t.Errorf("Unsure[%d] = %q, want it to start %q", i, got.Unsure[i], tc.unsure[i])
				}
			}
			if tc.restore4 != "" {
				if err != nil {
					t.Fatalf("NodeTools: %v", err)
				}
				if got.Restore[redirect.IPv4] != tc.restore4 {
					t.Errorf("IPv4 restore %q, want %q", got.Restore[redirect.IPv4], tc.restore4)
				}
				return
			}
			var missing *MissingToolsError
			if !errors.As(err, &missing) {
				t.Fatalf("NodeTools error = %v, want a *MissingToolsError", err)
			}
			if want := "of the node (its /usr, /sbin, /bin seen at " + view.Root + ", nothing else of it)"; !strings.HasSuffix(missing.Where, want) {
				t.Errorf("Where = %q, want it to end %q", missing.Where, want)
			}
			for _, u := range tc.unseen {
				if !slices.ContainsFunc(missing.Unseen, func(s string) bool { return strings.HasPrefix(s, u) }) {
					t.Errorf("Unseen = %q, want an entry starting %q", missing.Unseen, u)
				}
			}
			if len(tc.unseen) == 0 && len(missing.Unseen) > 0 {
				t.Errorf("Unseen = %q, want none", missing.Unseen)
			}
		})
	}
}

// A place the node's root can read and this process may not (an LSM's refusal
// of the agent, here the thread without CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH before a directory of mode 0) is unseen, not missing:
// the tools may be there.
func TestAPlaceThisProcessMayNotReadIsUnseen(t *testing.T) {
	root.Require(t)
	fs := noderoot.FS{Files: map[string]os.FileMode{"usr/local/sbin/xtables-legacy-multi": 0o755}, Links: map[string]string{}}
	for _, p := range []string{"iptables", "ip6tables"} {
		for _, op := range []string{"-save", "-restore"} {
			fs.Links["usr/local/sbin/"+p+"-legacy"+op] = "xtables-legacy-multi"
		}
	}
	view := NodeView{Root: fs.Make(t)}
	if _, err := NodeTools(view, ModeLegacy); err != nil {
		t.Fatalf("with every capability: %v", err)
	}
	sbin := filepath.Join(view.Root, "usr/local/sbin")
	if err := os.Chmod(sbin, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(sbin, 0o755) })
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with its lowered capabilities
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		for _, c := range []uint{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH} {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		_, err := NodeTools(view, ModeLegacy)
		errc <- err
	}()
	err := <-errc
	var missing *MissingToolsError
	if !errors.As(err, &missing) {
		t.Fatalf("NodeTools error = %v, want a *MissingToolsError", err)
	}
	want := "/usr/local/sbin/iptables-legacy-save: this process may not look at /usr/local/sbin/iptables-legacy-save (permission denied)"
	if !slices.Contains(missing.Unseen, want) {
		t.Errorf("Unseen = %q, want %q among them", missing.Unseen, want)
	}
}
