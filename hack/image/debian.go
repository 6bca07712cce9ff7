package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// The agent image's operating-system files come from Debian packages, the same
// version for both architectures where Debian has it: the packages DebianRoots
// names and everything they depend on (Depends and Pre-Depends, the first
// alternative that exists), minus DebianExcluded. The set is pinned in
// debian.lock, written by `go run ./hack/image/debianlock` from the Packages
// indexes of the Debian mirror this machine's apt uses (their InRelease files
// checked with gpgv against the Debian archive keyring). A build takes exactly
// the locked .debs, checks each one's SHA-256, and caches it under
// $ISTIO_CNI_CACHE/debian (default /var/cache/istio-cni) by that digest.

// DebianRoots are the packages the agent image needs: the iptables and nft tools
// the backends run in the container, base-files (/etc/os-release, which scanners
// read to know the distribution) and netbase (/etc/protocols, which iptables reads
// to resolve -p tcp).
var DebianRoots = []string{"base-files", "iptables", "netbase", "nftables"}

// DebianExcluded are dependencies left out, with the reason: only maintainer
// scripts use them, and no maintainer script runs in the image.
var DebianExcluded = map[string]string{
	"awk": "base-files pre-depends on it for its maintainer scripts, which do not run here",
}

// DebianArches are the image index's architectures, as Debian and Go both name them.
var DebianArches = []string{"amd64", "arm64"}

// DebianTestTools are packages the tests of this package use, for the build
// machine's architecture (amd64), never put in an image: qemu-user-static runs the
// arm64 image's tools once, without registering anything with the host's kernel
// (binfmt_misc).
var DebianTestTools = []string{"qemu-user-static"}

// testToolsArch is the architecture of DebianTestTools' packages.
const testToolsArch = "amd64"

// DebianLock is debian.lock: where the packages come from and each one pinned.
type DebianLock struct {
	// Distro is the distribution's ID and VERSION_ID (os-release), as package
	// URLs (purl) name it: debian-12.
	Distro string `json:"distro"`
	// Roots and Excluded are DebianRoots and DebianExcluded when the lock was written.
	Roots    []string          `json:"roots"`
	Excluded map[string]string `json:"excluded"`
	// Sources are the archives the indexes were read from: "<uri> <suite>".
	Sources []string `json:"sources"`
	// Packages are the pinned packages per architecture, sorted by name.
	Packages map[string][]LockedPackage `json:"packages"`
	// TestTools are DebianTestTools and their dependencies, for amd64.
	TestTools []LockedPackage `json:"testTools"`
}

// LockedPackage is one .deb: where it is and what its bytes hash to.
type LockedPackage struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Arch is the package's architecture: the image's, or "all".
	Arch string `json:"arch"`
	// Source is the source package's name and version when they differ from the
	// binary's ("glibc", "nftables 1.0.6-2"), as the index's Source field says.
	Source string `json:"source,omitempty"`
	// URL is the .deb on the mirror.
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

//go:embed debian.lock
var debianLockJSON []byte

// maxLockedPackages bounds debian.lock's packages per architecture.
const maxLockedPackages = 200

// LoadDebianLock reads the lock file built into this package and checks it: it is
// for DebianRoots, DebianExcluded and DebianArches, and every entry is complete.
func LoadDebianLock() (*DebianLock, error) {
	return parseDebianLock(debianLockJSON)
}

func parseDebianLock(data []byte) (*DebianLock, error) {
	var l DebianLock
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("debian.lock: %w", err)
	}
	if !slices.Equal(l.Roots, DebianRoots) || !mapsEqual(l.Excluded, DebianExcluded) {
		return nil, fmt.Errorf("debian.lock: written for roots %v excluding %v, but the image needs %v excluding %v: run go run ./hack/image/debianlock", l.Roots, l.Excluded, DebianRoots, DebianExcluded)
	}
	if !strings.HasPrefix(l.Distro, "debian-") {
		return nil, fmt.Errorf("debian.lock: distro %q is not debian-<version>", l.Distro)
	}
	for _, arch := range DebianArches {
		pkgs := l.Packages[arch]
		if len(pkgs) == 0 || len(pkgs) > maxLockedPackages {
			return nil, fmt.Errorf("debian.lock: %d packages for %s, want 1 to %d", len(pkgs), arch, maxLockedPackages)
		}
		for i, p := range pkgs {
			if p.Name == "" || p.Version == "" || !strings.HasPrefix(p.URL, "http") || p.Size <= 0 {
				return nil, fmt.Errorf("debian.lock: %s package %d (%q): name, version, url and size are all required", arch, i, p.Name)
			}
			if p.Arch != arch && p.Arch != "all" {
				return nil, fmt.Errorf("debian.lock: %s package %s: architecture %q", arch, p.Name, p.Arch)
			}
			if b, err := hex.DecodeString(p.SHA256); err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("debian.lock: %s package %s: sha256 %q is not 64 hex digits", arch, p.Name, p.SHA256)
			}
			if i > 0 && pkgs[i-1].Name >= p.Name {
				return nil, fmt.Errorf("debian.lock: %s packages not sorted by name at %s", arch, p.Name)
			}
		}
	}
	for _, p := range l.TestTools {
		if p.Arch != testToolsArch && p.Arch != "all" || p.URL == "" || len(p.SHA256) != 64 {
			return nil, fmt.Errorf("debian.lock: test tool %s: arch %q, url %q, sha256 %q", p.Name, p.Arch, p.URL, p.SHA256)
		}
	}
	for arch := range l.Packages {
		if !slices.Contains(DebianArches, arch) {
			return nil, fmt.Errorf("debian.lock: architecture %q is not one of %v", arch, DebianArches)
		}
	}
	return &l, nil
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// CacheDir is where downloads are kept between builds: $ISTIO_CNI_CACHE, by
// default /var/cache/istio-cni (the cache of the Kubernetes binaries).
func CacheDir() string {
	if d := os.Getenv("ISTIO_CNI_CACHE"); d != "" {
		return d
	}
	return "/var/cache/istio-cni"
}

// maxDebSize bounds one .deb download; the largest locked one is the tests'
// qemu-user-static, 63 MB (of the image's, libc6, under 3 MB).
const maxDebSize = 128 << 20

// debDownloadTimeout bounds one .deb download.
const debDownloadTimeout = 5 * time.Minute

// FetchDeb returns the path of p's .deb in the cache, downloading it first if it is
// not there. The file's SHA-256 must be the lock's: a cached file is checked again
// on every use, so a corrupted cache fails the build rather than the image.
func FetchDeb(ctx context.Context, p LockedPackage) (string, error) {
	dir := filepath.Join(CacheDir(), "debian")
	file := filepath.Join(dir, p.SHA256+".deb")
	if data, err := os.ReadFile(file); err == nil {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) == p.SHA256 {
			return file, nil
		}
		os.Remove(file)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	data, err := download(ctx, p.URL, maxDebSize, debDownloadTimeout)
	if err != nil {
		return "", fmt.Errorf("debian package %s %s: %w", p.Name, p.Version, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != p.SHA256 {
		return "", fmt.Errorf("debian package %s %s: %s has sha256 %x, the lock says %s", p.Name, p.Version, p.URL, sum, p.SHA256)
	}
	tmp, err := os.CreateTemp(dir, ".download-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", err
	}
	return file, os.Rename(tmp.Name(), file)
}

// download GETs url, refusing a body over limit bytes and giving up after timeout.
func download(ctx context.Context, url string, limit int64, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		hint := ""
		if resp.StatusCode == http.StatusNotFound {
			hint = " (the mirror no longer has this version: run go run ./hack/image/debianlock to pin the current ones)"
		}
		return nil, fmt.Errorf("get %s: %s%s", url, resp.Status, hint)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("get %s: larger than %d bytes", url, limit)
	}
	return data, nil
}

// indexPackage is one stanza of a Packages index.
type indexPackage struct {
	stanza
	Name, Version, Arch string
	Provides            []dependency
	base                string // the archive's URI
}

// packageIndex holds the candidates for each name: real packages and providers.
type packageIndex struct {
	byName     map[string][]*indexPackage
	providedBy map[string][]*indexPackage
}

func newPackageIndex() *packageIndex {
	return &packageIndex{byName: map[string][]*indexPackage{}, providedBy: map[string][]*indexPackage{}}
}

// add records the stanzas of one Packages index read from the archive at base.
func (ix *packageIndex) add(base string, stanzas []stanza) error {
	for _, s := range stanzas {
		p := &indexPackage{stanza: s, Name: s.Get("Package"), Version: s.Get("Version"), Arch: s.Get("Architecture"), base: base}
		if p.Name == "" || p.Version == "" {
			return fmt.Errorf("index %s: a stanza without Package or Version", base)
		}
		provides, err := parseDepends(s.Get("Provides"))
		if err != nil {
			return fmt.Errorf("index %s: %s Provides: %w", base, p.Name, err)
		}
		for _, alts := range provides {
			p.Provides = append(p.Provides, alts...)
			for _, pr := range alts {
				ix.providedBy[pr.Name] = append(ix.providedBy[pr.Name], p)
			}
		}
		ix.byName[p.Name] = append(ix.byName[p.Name], p)
	}
	return nil
}

// best returns the highest version of a real package named d.Name that meets d.
func (ix *packageIndex) best(d dependency) *indexPackage {
	var out *indexPackage
	for _, p := range ix.byName[d.Name] {
		if d.satisfiedBy(p.Version) && (out == nil || compareVersions(p.Version, out.Version) > 0) {
			out = p
		}
	}
	return out
}

// resolveDebian returns the closure of roots under Pre-Depends and Depends, sorted
// by name. For each dependency it keeps a package already chosen that meets it, or
// else takes the first alternative that the index has (the highest version that
// meets the relation, or a package providing the name); a name in excluded counts
// as met. A dependency nothing meets is an error naming the chain that needs it.
func resolveDebian(ix *packageIndex, roots []string, excluded map[string]string) ([]*indexPackage, error) {
	chosen := map[string]*indexPackage{}
	provided := map[string]*indexPackage{} // virtual name -> chosen provider
	type todo struct {
		p   *indexPackage
		via string
	}
	var queue []todo
	choose := func(p *indexPackage, via string) {
		if chosen[p.Name] != nil {
			return
		}
		chosen[p.Name] = p
		for _, pr := range p.Provides {
			provided[pr.Name] = p
		}
		queue = append(queue, todo{p, via})
	}
	for _, r := range roots {
		p := ix.best(dependency{Name: r})
		if p == nil {
			return nil, fmt.Errorf("root package %s: not in the index", r)
		}
		choose(p, r)
	}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		for _, field := range []string{"Pre-Depends", "Depends"} {
			entries, err := parseDepends(t.p.Get(field))
			if err != nil {
				return nil, fmt.Errorf("%s %s %s: %w", t.via, t.p.Name, field, err)
			}
		entry:
			for _, alts := range entries {
				for _, d := range alts {
					if excluded[d.Name] != "" {
						continue entry
					}
					if c := chosen[d.Name]; c != nil {
						if !d.satisfiedBy(c.Version) {
							return nil, fmt.Errorf("%s -> %s needs %s, but %s %s is chosen", t.via, t.p.Name, d, c.Name, c.Version)
						}
						continue entry
					}
					if d.Op == "" && provided[d.Name] != nil {
						continue entry
					}
				}
				for _, d := range alts {
					if p := ix.best(d); p != nil {
						choose(p, t.via+" -> "+t.p.Name)
						continue entry
					}
					if d.Op == "" && len(ix.providedBy[d.Name]) > 0 {
						providers := append([]*indexPackage(nil), ix.providedBy[d.Name]...)
						sort.Slice(providers, func(i, j int) bool { return providers[i].Name < providers[j].Name })
						choose(providers[0], t.via+" -> "+t.p.Name)
						continue entry
					}
				}
				return nil, fmt.Errorf("%s -> %s %s: nothing in the index meets %v", t.via, t.p.Name, field, alts)
			}
		}
	}
	out := make([]*indexPackage, 0, len(chosen))
	for _, p := range chosen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// lockedFrom turns a resolved package into its lock entry.
func lockedFrom(p *indexPackage) (LockedPackage, error) {
	size, err := parseSize(p.Get("Size"))
	if err != nil {
		return LockedPackage{}, fmt.Errorf("%s %s: Size: %w", p.Name, p.Version, err)
	}
	file := p.Get("Filename")
	if file == "" || strings.Contains(file, "..") {
		return LockedPackage{}, fmt.Errorf("%s %s: Filename %q", p.Name, p.Version, file)
	}
	return LockedPackage{
		Name: p.Name, Version: p.Version, Arch: p.Arch, Source: p.Get("Source"),
		URL: strings.TrimSuffix(p.base, "/") + "/" + file, SHA256: p.Get("SHA256"), Size: size,
	}, nil
}

func parseSize(s string) (int64, error) {
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive size", s)
	}
	return n, nil
}
