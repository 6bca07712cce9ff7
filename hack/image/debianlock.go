package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ulikunitz/xz"
)

// AptSource is one archive of the machine's apt configuration: deb <URI> <Suite>
// main, signed by the keyring at Keyring.
type AptSource struct {
	URI, Suite, Keyring string
}

// defaultKeyring is the keyring apt checks Debian's archives with when a source
// names none.
const defaultKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// AptSources reads the Debian archives apt uses on the machine at root ("/"): the
// deb822 files (sources.list.d/*.sources) and the one-line ones (sources.list,
// sources.list.d/*.list), keeping the binary ("deb") entries with the main
// component whose suite is the release's (codename, codename-updates,
// codename-security), from /etc/os-release's VERSION_CODENAME.
func AptSources(root string) (codename, distro string, sources []AptSource, err error) {
	osr, err := readOSRelease(filepath.Join(root, "etc/os-release"))
	if err != nil {
		return "", "", nil, err
	}
	codename = osr["VERSION_CODENAME"]
	if osr["ID"] != "debian" || codename == "" || osr["VERSION_ID"] == "" {
		return "", "", nil, fmt.Errorf("/etc/os-release: ID=%q VERSION_ID=%q VERSION_CODENAME=%q: the image's packages are taken from Debian's archives, read from a Debian machine", osr["ID"], osr["VERSION_ID"], codename)
	}
	distro = "debian-" + osr["VERSION_ID"]
	keep := func(types, uris, suites, comps, signedBy string) {
		if !strings.Contains(" "+types+" ", " deb ") || !strings.Contains(" "+comps+" ", " main ") {
			return
		}
		if signedBy == "" {
			signedBy = defaultKeyring
		}
		for _, uri := range strings.Fields(uris) {
			for _, suite := range strings.Fields(suites) {
				if suite == codename || strings.HasPrefix(suite, codename+"-") {
					sources = append(sources, AptSource{URI: strings.TrimSuffix(uri, "/"), Suite: suite, Keyring: signedBy})
				}
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(root, "etc/apt/sources.list.d/*.sources"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", "", nil, err
		}
		stanzas, err := parseControl(bytes.NewReader(data))
		if err != nil {
			return "", "", nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, s := range stanzas {
			if strings.EqualFold(s.Get("Enabled"), "no") {
				continue
			}
			keep(s.Get("Types"), s.Get("URIs"), s.Get("Suites"), s.Get("Components"), s.Get("Signed-By"))
		}
	}
	lists, _ := filepath.Glob(filepath.Join(root, "etc/apt/sources.list.d/*.list"))
	for _, f := range append([]string{filepath.Join(root, "etc/apt/sources.list")}, lists...) {
		data, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return "", "", nil, err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			line, _, _ := strings.Cut(sc.Text(), "#")
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[0] != "deb" {
				continue
			}
			signedBy := ""
			if strings.HasPrefix(fields[1], "[") { // options: [arch=amd64 signed-by=...]
				var i int
				for i = 1; i < len(fields); i++ {
					opt := strings.Trim(fields[i], "[]")
					if v, ok := strings.CutPrefix(opt, "signed-by="); ok {
						signedBy = v
					}
					if strings.HasSuffix(fields[i], "]") {
						break
					}
				}
				fields = append([]string{"deb"}, fields[i+1:]...)
				if len(fields) < 4 {
					continue
				}
			}
			keep("deb", fields[1], fields[2], strings.Join(fields[3:], " "), signedBy)
		}
	}
	if len(sources) == 0 {
		return "", "", nil, fmt.Errorf("no deb source with the main component for %s in %s/etc/apt", codename, root)
	}
	return codename, distro, sources, nil
}

func readOSRelease(file string) (map[string]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if ok {
			out[k] = strings.Trim(v, `"'`)
		}
	}
	return out, nil
}

// Limits of what the lock writer downloads: an InRelease file (Debian's is about
// 150 kB) and a compressed Packages index (bookworm main's is about 9 MB; its
// uncompressed form about 45 MB).
const (
	maxInRelease     = 4 << 20
	maxPackagesXZ    = 64 << 20
	maxPackagesPlain = 512 << 20
	indexTimeout     = 10 * time.Minute
	// gpgvTimeout bounds checking one InRelease signature (milliseconds here).
	gpgvTimeout = time.Minute
)

// WriteDebianLock reads the Packages indexes of sources for each of DebianArches,
// resolves DebianRoots in each and writes the lock to file. Each InRelease file is
// checked with gpgv against its source's keyring, each index against the SHA-256
// the InRelease lists.
func WriteDebianLock(ctx context.Context, file, distro string, sources []AptSource) error {
	lock := DebianLock{Distro: distro, Roots: DebianRoots, Excluded: DebianExcluded, Packages: map[string][]LockedPackage{}}
	for _, s := range sources {
		lock.Sources = append(lock.Sources, s.URI+" "+s.Suite)
	}
	for _, arch := range DebianArches {
		ix := newPackageIndex()
		for _, s := range sources {
			stanzas, err := readPackagesIndex(ctx, s, arch)
			if err != nil {
				return err
			}
			if err := ix.add(s.URI, stanzas); err != nil {
				return err
			}
		}
		resolved, err := resolveDebian(ix, DebianRoots, DebianExcluded)
		if err != nil {
			return fmt.Errorf("%s: %w", arch, err)
		}
		for _, p := range resolved {
			lp, err := lockedFrom(p)
			if err != nil {
				return fmt.Errorf("%s: %w", arch, err)
			}
			lock.Packages[arch] = append(lock.Packages[arch], lp)
		}
		if arch != testToolsArch {
			continue
		}
		tools, err := resolveDebian(ix, DebianTestTools, nil)
		if err != nil {
			return fmt.Errorf("test tools: %w", err)
		}
		for _, p := range tools {
			lp, err := lockedFrom(p)
			if err != nil {
				return fmt.Errorf("test tools: %w", err)
			}
			lock.TestTools = append(lock.TestTools, lp)
		}
	}
	data, err := json.MarshalIndent(lock, "", "  ")
	if err != nil {
		return err
	}
	if _, err := parseDebianLock(data); err != nil {
		return err
	}
	return os.WriteFile(file, append(data, '\n'), 0o644)
}

// readPackagesIndex downloads and checks the main component's Packages index of
// one source for arch.
func readPackagesIndex(ctx context.Context, s AptSource, arch string) ([]stanza, error) {
	dists := s.URI + "/dists/" + s.Suite
	signed, err := download(ctx, dists+"/InRelease", maxInRelease, indexTimeout)
	if err != nil {
		return nil, err
	}
	release, err := verifyInRelease(ctx, signed, s.Keyring)
	if err != nil {
		return nil, fmt.Errorf("%s/InRelease: %w", dists, err)
	}
	name := "main/binary-" + arch + "/Packages.xz"
	want := ""
	stanzas, err := parseControl(bytes.NewReader(release))
	if err != nil || len(stanzas) == 0 {
		return nil, fmt.Errorf("%s/InRelease: %v", dists, err)
	}
	for _, line := range strings.Split(stanzas[0].Get("SHA256"), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == name {
			want = f[0]
		}
	}
	if want == "" {
		return nil, fmt.Errorf("%s/InRelease lists no %s", dists, name)
	}
	compressed, err := download(ctx, dists+"/"+name, maxPackagesXZ, indexTimeout)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(compressed); hex.EncodeToString(sum[:]) != want {
		return nil, fmt.Errorf("%s/%s: sha256 %x, InRelease says %s", dists, name, sum, want)
	}
	xr, err := xz.NewReader(bytes.NewReader(compressed))
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dists, name, err)
	}
	plain, err := readAllLimit(xr, maxPackagesPlain)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dists, name, err)
	}
	return parseControl(bytes.NewReader(plain))
}

// verifyInRelease checks a clear-signed InRelease file with gpgv and returns the
// signed text.
func verifyInRelease(ctx context.Context, signed []byte, keyring string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, gpgvTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "gpgv", "--keyring", keyring, "--output", "-", "-")
	cmd.Stdin = bytes.NewReader(signed)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("gpgv --keyring %s: %w: %s", keyring, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
