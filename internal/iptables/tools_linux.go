package iptables

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// NodePath is where the tools are looked for on a filesystem other than this
// process's: the PATH a container runtime gives the plugins it runs.
var NodePath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// NodePathDirs are the node's directories that hold NodePath: a container that
// has them mounted at their own paths under one directory (the chart mounts them
// read-only under /host) sees the node's tools, and nothing else of the node.
var NodePathDirs = []string{"/usr", "/sbin", "/bin"}

// A NodeView is a node's filesystem as this process sees it.
type NodeView struct {
	// Root is where the node's / shows: the root of a node process seen through
	// the node's /proc (the agent's /host/proc/1/root: all of the node), or a
	// directory under which some of the node's directories are mounted at their
	// own paths. "" when the node is not visible.
	Root string
	// Dirs, when set, are the only directories of the node Root shows (each
	// mounted at Root+dir): a path that leads outside them is not seen, neither
	// found nor missing. Nil: Root shows the whole node.
	Dirs []string
}

// Visible says whether the view shows anything of the node.
func (v NodeView) Visible() bool { return v.Root != "" }

// String says what the view shows, for messages.
func (v NodeView) String() string {
	switch {
	case v.Root == "":
		return "nothing of the node"
	case v.Dirs == nil:
		return "seen at " + v.Root
	}
	return "its " + strings.Join(v.Dirs, ", ") + " seen at " + v.Root + ", nothing else of it"
}

// shows says whether p, a clean absolute path on the node, is in the view.
func (v NodeView) shows(p string) bool {
	if v.Dirs == nil {
		return true
	}
	for _, d := range v.Dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// unseenError says that a path on the node cannot be judged from the view: it
// leads outside what the view shows, or this process may not look there (an LSM
// such as SELinux, a view's limit, not the node's: the plugin runs as the
// node's root).
type unseenError struct {
	path string // the path asked for
	why  string
}

func (e *unseenError) Error() string { return e.path + ": " + e.why }

// maxLinks is how many links a path's resolution follows, as the kernel's
// (MAXSYMLINKS) before it answers ELOOP.
const maxLinks = 40

// resolve resolves path, a path on the node, in the view as the node's kernel
// resolves it: every link on the way is followed by hand, and an absolute target
// is a path on the node, so it resolves under v.Root, never in this process's
// filesystem (a link never leads out of the view's root). It returns the path on
// the node it ends at and what is there (not followed), or an error: one the
// node would give too (fs.ErrNotExist, ENOTDIR, ELOOP), or an *unseenError. Each
// prefix it stats is one it has resolved, with no link left in it.
func (v NodeView) resolve(path string) (string, fs.FileInfo, error) {
	resolved := "/"
	rest := strings.Split(path, "/")
	links := 0
	var last fs.FileInfo
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			resolved, last = filepath.Dir(resolved), nil
			continue
		}
		next := filepath.Join(resolved, name)
		if !v.shows(next) {
			return "", nil, &unseenError{path, "it leads to " + filepath.Join(append([]string{next}, rest...)...) + ", outside what this process sees of the node"}
		}
		fi, err := os.Lstat(filepath.Join(v.Root, next))
		switch {
		case errors.Is(err, fs.ErrPermission):
			return "", nil, &unseenError{path, fmt.Sprintf("this process may not look at %s (%v)", next, errors.Unwrap(err))}
		case err != nil:
			return "", nil, err
		case fi.Mode()&fs.ModeSymlink == 0:
			if len(rest) > 0 && !fi.IsDir() {
				return "", nil, &fs.PathError{Op: "resolve", Path: next, Err: unix.ENOTDIR}
			}
			resolved, last = next, fi
			continue
		}
		if links++; links > maxLinks {
			return "", nil, &fs.PathError{Op: "resolve", Path: path, Err: unix.ELOOP}
		}
		target, err := os.Readlink(filepath.Join(v.Root, next))
		if err != nil {
			return "", nil, err
		}
		if filepath.IsAbs(target) {
			resolved = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
		last = nil
	}
	if last == nil { // the path ended at "/" or with ".."
		fi, err := os.Lstat(filepath.Join(v.Root, resolved))
		if err != nil {
			return "", nil, err
		}
		last = fi
	}
	return resolved, last, nil
}

// lookup finds a tool by name, as exec.LookPath does: its path, or "" with the
// places it could be that cannot be seen (unseen; nil on this process's own
// filesystem). where says where it looks, for the error that names what is
// missing.
type lookup struct {
	find  func(name string) (path string, unseen []string)
	where string
}

// lookupAt is how the tools are found in a view: on "/" (the whole of this
// process's filesystem), this process's PATH, as the plugin finds them on the
// node; on another root (a node seen from a container: the agent's
// /host/proc/1/root, or the node's NodePathDirs mounted under /host), NodePath's
// directories in the view, each name resolved as the node resolves it
// (NodeView.resolve: an absolute target such as Debian's /etc/alternatives is a
// path on the node). A dangling link or a file that is not executable does not
// count: the node's exec.LookPath would not find it either. A directory or name
// that leads where the view does not show is unseen: a tool there can be neither
// found nor missed.
func lookupAt(v NodeView) lookup {
	if v.Root == "/" && v.Dirs == nil {
		return lookup{find: func(name string) (string, []string) {
			p, err := exec.LookPath(name)
			if err != nil {
				return "", nil
			}
			return p, nil
		}, where: "PATH"}
	}
	// A directory that cannot be seen is so for every name: said once.
	dirs := map[string]error{}
	for _, d := range NodePath {
		if _, _, err := v.resolve(d); err != nil {
			dirs[d] = err
		}
	}
	return lookup{
		find: func(name string) (string, []string) {
			var unseen []string
			for _, dir := range NodePath {
				var u *unseenError
				if errors.As(dirs[dir], &u) {
					unseen = append(unseen, u.Error())
					continue
				}
				p := filepath.Join(dir, name)
				_, fi, err := v.resolve(p)
				switch {
				case errors.As(err, &u):
					unseen = append(unseen, u.Error())
				case err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0:
					return p, nil
				}
			}
			return "", unseen
		},
		where: strings.Join(NodePath, ", ") + " of the node (" + v.String() + ")",
	}
}

// detect is ModeAuto's choice: nft when iptables-nft-restore is found, else
// legacy; unsure lists where iptables-nft-restore could be but cannot be seen
// (the choice may be nft there).
func detect(look lookup) (mode Mode, unsure []string) {
	p, unseen := look.find("iptables-nft-restore")
	if p != "" {
		return ModeNFT, nil
	}
	return ModeLegacy, unseen
}

// DetectMode is ModeAuto's choice in view v (lookupAt): nft when
// iptables-nft-restore is installed, else legacy. With the root "/" it
// searches PATH, as the plugin does on the node. Another view is a node seen
// from a container (the agent's /host/proc/1/root): there the agent and the
// doctor, whose image carries both flavours, pick the flavour the node's plugin
// picks, so they read and write the same rules it does.
func DetectMode(v NodeView) Mode {
	mode, _ := detect(lookupAt(v))
	return mode
}

// findTools resolves mode (ModeAuto by detect) and, per family, the save and
// restore tools the backend runs: the mode's own names, or for iptables before
// 1.8 the plain ones. It is the plugin's one choice of its tools: NewBackend
// makes it on PATH, NodeTools in a view of a node. A missing tool is an error
// naming every name tried and where, and what could not be seen; unsure is
// detect's.
func findTools(mode Mode, look lookup) (resolved Mode, found map[redirect.Family]tools, unsure []string, err error) {
	resolved = mode
	if mode == ModeAuto {
		resolved, unsure = detect(look)
	}
	found = map[redirect.Family]tools{}
	var missing, unseen []string
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		prefix := "iptables"
		if f == redirect.IPv6 {
			prefix = "ip6tables"
		}
		var t tools
		for _, cand := range []tools{
			{save: prefix + "-" + string(resolved) + "-save", restore: prefix + "-" + string(resolved) + "-restore", flavoured: true},
			{save: prefix + "-save", restore: prefix + "-restore"}, // iptables before 1.8 has no suffixed names
		} {
			s, u1 := look.find(cand.save)
			r, u2 := look.find(cand.restore)
			if s != "" && r != "" {
				t = tools{save: s, restore: r, flavoured: cand.flavoured}
				break
			}
			for _, u := range append(u1, u2...) {
				if !slices.Contains(unseen, u) {
					unseen = append(unseen, u)
				}
			}
		}
		if t.save == "" {
			missing = append(missing, fmt.Sprintf("%s-%s-save and %s-%s-restore (or %s-save and %s-restore)", prefix, resolved, prefix, resolved, prefix, prefix))
			continue
		}
		found[f] = t
	}
	if len(missing) > 0 {
		return resolved, nil, unsure, &MissingToolsError{Mode: resolved, Missing: missing, Where: look.where, Unseen: unseen}
	}
	return resolved, found, unsure, nil
}

// MissingToolsError says which tools of a mode were not found, where they were
// looked for, and where they could be but could not be seen (Unseen: then they
// may be installed there, and the node may run the plugin after all).
type MissingToolsError struct {
	Mode    Mode
	Missing []string
	Where   string
	Unseen  []string
}

func (e *MissingToolsError) Error() string {
	msg := fmt.Sprintf("found no %s, in %s", strings.Join(e.Missing, ", nor "), e.Where)
	if len(e.Unseen) > 0 {
		msg += "; not seen, so they may be installed there: " + strings.Join(e.Unseen, "; ")
	}
	return msg
}

// Tools are the tools the plugin runs on a node: its mode and, per family, the
// paths of the save and restore tools as the node names them.
type Tools struct {
	Mode     Mode
	Save     map[redirect.Family]string
	Restore  map[redirect.Family]string
	Detected bool // Mode was ModeAuto's choice
	// Unsure, for a detected legacy Mode, lists where iptables-nft-restore could
	// be installed but cannot be seen: the plugin may pick nft there.
	Unsure []string
}

// NodeTools is the plugin's choice of its tools (findTools) in view v of a
// node: what NewBackend picks when the plugin runs on that node with mode. The
// error is a *MissingToolsError when a tool is not found.
func NodeTools(v NodeView, mode Mode) (Tools, error) {
	resolved, found, unsure, err := findTools(mode, lookupAt(v))
	t := Tools{Mode: resolved, Detected: mode == ModeAuto, Unsure: unsure, Save: map[redirect.Family]string{}, Restore: map[redirect.Family]string{}}
	if err != nil {
		return t, err
	}
	for f, ft := range found {
		t.Save[f], t.Restore[f] = ft.save, ft.restore
	}
	return t, nil
}
