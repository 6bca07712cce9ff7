package iptables

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// NodePath is where the tools are looked for on a filesystem other than this
// process's: the PATH a container runtime gives the plugins it runs.
var NodePath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// lookup finds a tool by name, as exec.LookPath does; where says where it looks,
// for the error that names what is missing.
type lookup struct {
	find  func(name string) (string, error)
	where string
}

// lookupAt is how the tools are found on the filesystem at root: on "/", this
// process's PATH, as the plugin finds them on the node; on another root (a
// node seen from a container, the agent's /host/proc/1/root), NodePath's
// directories under root.
func lookupAt(root string) lookup {
	if root == "/" {
		return lookup{find: exec.LookPath, where: "PATH"}
	}
	return lookup{
		find: func(name string) (string, error) {
			for _, dir := range NodePath {
				if p := filepath.Join(dir, name); executableIn(root, p) {
					return p, nil
				}
			}
			return "", exec.ErrNotFound
		},
		where: strings.Join(NodePath, ", ") + " of the node (seen at " + root + ")",
	}
}

// executableIn says whether path, on the filesystem at root, is an executable
// regular file, following links as the node would: an absolute target (Debian's
// alternatives, /usr/sbin/iptables-nft-restore -> /etc/alternatives/... ->
// /usr/sbin/xtables-nft-multi) is a path on the node, so it resolves under root
// (openat2's RESOLVE_IN_ROOT), not in this process's filesystem. A dangling
// link does not count: the node's exec.LookPath would not find it either. Where
// openat2 is missing (a kernel before 5.6) or refused (a container runtime's
// seccomp profile older than it answers EPERM), the links of the name itself
// are followed by hand (followIn).
func executableIn(root, path string) bool {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, strings.TrimPrefix(path, "/"), &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	switch {
	case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
		return executableFollowedIn(root, path)
	case err != nil:
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && isExecutable(&st)
}

func isExecutable(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0
}

// executableFollowedIn is executableIn without openat2: path's own links
// followed by hand (followIn).
func executableFollowedIn(root, path string) bool {
	var st unix.Stat_t
	return unix.Stat(followIn(root, path), &st) == nil && isExecutable(&st)
}

// followIn follows the links of path's last name within root (an absolute
// target is a path under root), at most 40 of them as the kernel does, and
// returns the path under root it ends at. Links of the directories on the way
// are the kernel's to follow: a relative one stays in root (a merged /usr's
// /sbin -> usr/sbin).
func followIn(root, path string) string {
	for range 40 {
		target, err := os.Readlink(filepath.Join(root, path))
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = filepath.Clean("/" + target)
	}
	return filepath.Join(root, path)
}

// detect is ModeAuto's choice: nft when iptables-nft-restore is found, else
// legacy.
func detect(look lookup) Mode {
	if _, err := look.find("iptables-nft-restore"); err == nil {
		return ModeNFT
	}
	return ModeLegacy
}

// DetectMode is ModeAuto's choice for the filesystem at root (lookupAt): nft
// when iptables-nft-restore is installed, else legacy. With root "/" it
// searches PATH, as the plugin does on the node. Another root is a node seen
// from a container (the agent's /host/proc/1/root): there the agent and the
// doctor, whose image carries both flavours, pick the flavour the node's plugin
// picks, so they read and write the same rules it does.
func DetectMode(root string) Mode { return detect(lookupAt(root)) }

// findTools resolves mode (ModeAuto by detect) and, per family, the save and
// restore tools the backend runs: the mode's own names, or for iptables before
// 1.8 the plain ones. It is the plugin's one choice of its tools: NewBackend
// makes it on PATH, NodeTools on a node's root. A missing tool is an error
// naming every name tried and where.
func findTools(mode Mode, look lookup) (Mode, map[redirect.Family]tools, error) {
	if mode == ModeAuto {
		mode = detect(look)
	}
	found := map[redirect.Family]tools{}
	var missing []string
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		prefix := "iptables"
		if f == redirect.IPv6 {
			prefix = "ip6tables"
		}
		var t tools
		for _, cand := range []tools{
			{save: prefix + "-" + string(mode) + "-save", restore: prefix + "-" + string(mode) + "-restore", flavoured: true},
			{save: prefix + "-save", restore: prefix + "-restore"}, // iptables before 1.8 has no suffixed names
		} {
			s, err1 := look.find(cand.save)
			r, err2 := look.find(cand.restore)
			if err1 == nil && err2 == nil {
				t = tools{save: s, restore: r, flavoured: cand.flavoured}
				break
			}
		}
		if t.save == "" {
			missing = append(missing, fmt.Sprintf("%s-%s-save and %s-%s-restore (or %s-save and %s-restore)", prefix, mode, prefix, mode, prefix, prefix))
			continue
		}
		found[f] = t
	}
	if len(missing) > 0 {
		return mode, nil, &MissingToolsError{Mode: mode, Missing: missing, Where: look.where}
	}
	return mode, found, nil
}

// MissingToolsError says which tools of a mode are not installed, and where
// they were looked for.
type MissingToolsError struct {
	Mode    Mode
	Missing []string
	Where   string
}

func (e *MissingToolsError) Error() string {
	return fmt.Sprintf("found no %s, in %s", strings.Join(e.Missing, ", nor "), e.Where)
}

// Tools are the tools the plugin runs on a node: its mode and, per family, the
// paths of the save and restore tools as the node names them.
type Tools struct {
	Mode     Mode
	Save     map[redirect.Family]string
	Restore  map[redirect.Family]string
	Detected bool // Mode was ModeAuto's choice
}

// NodeTools is the plugin's choice of its tools (findTools) on the filesystem at
// root: what NewBackend picks when the plugin runs on that node with mode. The
// error is a *MissingToolsError when a tool is not installed.
func NodeTools(root string, mode Mode) (Tools, error) {
	resolved, found, err := findTools(mode, lookupAt(root))
	t := Tools{Mode: resolved, Detected: mode == ModeAuto, Save: map[redirect.Family]string{}, Restore: map[redirect.Family]string{}}
	if err != nil {
		return t, err
	}
	for f, ft := range found {
		t.Save[f], t.Restore[f] = ft.save, ft.restore
	}
	return t, nil
}
