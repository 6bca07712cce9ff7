package image

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// The agent programs and reads pods' rules from inside its container: repair in
// place writes a broken pod's redirection, and istio-cni-doctor reads it back. Both
// run the same backends as the plugin on the node, which exec iptables-save and
// iptables-restore (either flavour) or read nftables rules with nft. So the image
// carries those tools, copied from the machine that builds it (Debian's iptables
// and nftables packages, which make test installs), with the shared libraries they
// load and the xtables match and target modules.

// multiarch is where Debian keeps amd64 libraries; the image is linux/amd64.
const multiarch = "/usr/lib/x86_64-linux-gnu"

// hostToolBinaries are the real executables; every tool name is a link to one.
var hostToolBinaries = []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/nft"}

// hostToolLinks are the names the backends look up in PATH. iptables without a
// suffix is the nft flavour, as on current distributions.
func hostToolLinks() map[string]string {
	links := map[string]string{}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			links[fam+suffix] = "xtables-nft-multi"
			links[fam+"-nft"+suffix] = "xtables-nft-multi"
			links[fam+"-legacy"+suffix] = "xtables-legacy-multi"
		}
	}
	return links
}

// HostTools returns the image files for iptables (nft and legacy) and nft, taken
// from the filesystem at root ("/" for this machine): the binaries, links for every
// name the backends run, the xtables modules, the dynamic loader and every shared
// library these need (found from the ELF files themselves, not from ldd), and the
// /lib and /lib64 links the loader's paths go through. A missing file is an error
// naming it and the package that provides it.
func HostTools(root string) ([]File, error) {
	var files []File
	seen := map[string]bool{}
	add := func(f File) {
		if !seen[f.Path] {
			seen[f.Path] = true
			files = append(files, f)
		}
	}
	var elfs []string // host paths whose libraries are still to resolve
	for _, bin := range hostToolBinaries {
		src := filepath.Join(root, bin)
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("agent image tools: %s: %w (install Debian's iptables and nftables packages)", src, err)
		}
		add(File{Path: bin, Source: src})
		elfs = append(elfs, src)
	}
	for name, target := range hostToolLinks() {
		add(File{Path: "/usr/sbin/" + name, Link: target})
	}
	modules, err := filepath.Glob(filepath.Join(root, multiarch, "xtables", "*.so"))
	if err != nil || len(modules) == 0 {
		return nil, fmt.Errorf("agent image tools: no xtables modules in %s (install Debian's iptables package)", filepath.Join(root, multiarch, "xtables"))
	}
	for _, m := range modules {
		add(File{Path: path.Join(multiarch, "xtables", filepath.Base(m)), Source: m})
		elfs = append(elfs, m)
	}

	// The loader: binaries name /lib64/ld-linux-x86-64.so.2.
	interp := ""
	for len(elfs) > 0 {
		src := elfs[0]
		elfs = elfs[1:]
		f, err := elf.Open(src)
		if err != nil {
			return nil, fmt.Errorf("agent image tools: %s: %w", src, err)
		}
		needed, err := f.ImportedLibraries()
		if interp == "" {
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					b := make([]byte, p.Filesz)
					if _, rerr := p.ReadAt(b, 0); rerr == nil {
						interp = strings.TrimRight(string(b), "\x00")
					}
				}
			}
		}
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("agent image tools: %s: read its libraries: %w", src, err)
		}
		for _, lib := range needed {
			dst := path.Join(multiarch, lib)
			if seen[dst] {
				continue
			}
			libSrc, err := findLibrary(root, lib)
			if err != nil {
				return nil, fmt.Errorf("agent image tools: %s needs %s: %w", src, lib, err)
			}
			add(File{Path: dst, Source: libSrc})
			elfs = append(elfs, libSrc)
		}
	}
	if interp == "" {
		return nil, fmt.Errorf("agent image tools: %s names no dynamic loader", hostToolBinaries[0])
	}
	// The loader is copied where the multiarch libraries are, and its own path
	// reached through links (/lib64 -> usr/lib64 -> ...), as on Debian.
	loaderSrc, err := filepath.EvalSymlinks(filepath.Join(root, interp))
	if err != nil {
		return nil, fmt.Errorf("agent image tools: dynamic loader %s: %w", interp, err)
	}
	loader := path.Join(multiarch, path.Base(interp))
	add(File{Path: loader, Source: loaderSrc})
	add(File{Path: "/lib", Link: "usr/lib"})
	if strings.HasPrefix(interp, "/lib64/") {
		add(File{Path: "/lib64", Link: "usr/lib64"})
		add(File{Path: path.Join("/usr/lib64", path.Base(interp)), Link: loader})
	}
	// iptables resolves protocol names (-p tcp) through /etc/protocols when present.
	if p := filepath.Join(root, "etc", "protocols"); fileExists(p) {
		add(File{Path: "/etc/protocols", Source: p})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}

// findLibrary finds a shared library by its soname where the loader looks.
func findLibrary(root, soname string) (string, error) {
	for _, dir := range []string{multiarch, "/lib/x86_64-linux-gnu", "/usr/lib", "/lib"} {
		p := filepath.Join(root, dir, soname)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return real, nil
		}
	}
	return "", fmt.Errorf("not found in %s or /usr/lib under %s", multiarch, root)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
