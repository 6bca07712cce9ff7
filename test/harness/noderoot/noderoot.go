// Package noderoot makes a node's root filesystem for a test, in a temp dir: the
// files a node's iptables package installs (or not), with its links, for code
// that judges a node from its filesystem (iptables.NodeTools, the agent's node
// check) as the agent sees it through the node's /proc.
package noderoot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FS is a node's filesystem: files (their mode) and symbolic links, each by its
// path under the root.
type FS struct {
	Files map[string]os.FileMode
	Links map[string]string // path -> link target
	Dirs  []string          // directories made even when empty
}

// Make writes fs under a new temp dir and returns it. The root holds usr/, as a
// node's does (plugin.NodeRootIn looks for it).
func (fs FS) Make(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	mkdir := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mkdir("usr")
	for _, d := range fs.Dirs {
		mkdir(d)
	}
	for p, mode := range fs.Files {
		mkdir(filepath.Dir(p))
		if err := os.WriteFile(filepath.Join(root, p), []byte("#!/bin/sh\nexit 1\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	for p, target := range fs.Links {
		mkdir(filepath.Dir(p))
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Debian is Debian 12's iptables package with flavour ("nft" or "legacy") the
// alternatives' choice: the two multi-call binaries, each flavoured tool a
// relative link to one, and each plain name a link to /etc/alternatives, which
// links back to a flavoured name (update-alternatives' absolute targets, paths
// on the node, not in the container that looks at it); ip6tables the same.
func Debian(flavour string) FS {
	fs := FS{Files: map[string]os.FileMode{"usr/sbin/xtables-nft-multi": 0o755, "usr/sbin/xtables-legacy-multi": 0o755}, Links: map[string]string{}}
	for _, prefix := range []string{"iptables", "ip6tables"} {
		for _, tool := range []string{"", "-save", "-restore"} {
			name := prefix + tool
			fs.Links["usr/sbin/"+name] = "/etc/alternatives/" + name
			fs.Links["etc/alternatives/"+name] = "/usr/sbin/" + prefix + "-" + flavour + tool
			for _, f := range []string{"nft", "legacy"} {
				fs.Links["usr/sbin/"+prefix+"-"+f+tool] = "xtables-" + f + "-multi"
			}
		}
	}
	return fs
}

// Minimal is a node OS without iptables (Talos, Bottlerocket, Flatcar's
// minimal images): a runtime and nothing of netfilter's.
func Minimal() FS {
	return FS{Files: map[string]os.FileMode{"usr/bin/containerd": 0o755, "usr/bin/kubelet": 0o755}}
}

// Mounted is fs as a container sees it with only dirs of the node mounted at
// their own paths (the chart's read-only mounts of the node's /usr, /sbin and
// /bin under /host): each dir's content, where a dir that is a link on the node
// (a merged /usr's sbin -> usr/sbin) shows its target's content, as a bind mount
// of it does. Nothing else of fs is in it.
func (fs FS) Mounted(dirs ...string) FS {
	out := FS{Files: map[string]os.FileMode{}, Links: map[string]string{}}
	for _, d := range dirs {
		d = strings.Trim(d, "/")
		src := d
		if target, ok := fs.Links[d]; ok {
			src = strings.Trim(filepath.Join(filepath.Dir(d), target), "/")
			if filepath.IsAbs(target) {
				src = strings.Trim(target, "/")
			}
		}
		for p, mode := range fs.Files {
			if rest, ok := strings.CutPrefix(p, src+"/"); ok {
				out.Files[d+"/"+rest] = mode
			}
		}
		for p, target := range fs.Links {
			if rest, ok := strings.CutPrefix(p, src+"/"); ok {
				out.Links[d+"/"+rest] = target
			}
		}
		out.Dirs = append(out.Dirs, d)
	}
	return out
}
