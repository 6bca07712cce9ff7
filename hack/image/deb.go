package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// debEntry is one entry of a package's data.tar: a file, a directory or a symlink.
type debEntry struct {
	Path string // absolute, as the package ships it (/lib/..., /usr/...)
	Dir  bool
	Link string
	Mode int64
	Data []byte
}

// debPackage is a read .deb: its control stanza, md5sums, conffiles and files.
type debPackage struct {
	Control   stanza
	MD5sums   []byte // control.tar's md5sums, as shipped
	Conffiles []string
	Entries   []debEntry
}

func (p *debPackage) Name() string { return p.Control.Get("Package") }

// maxDebUnpacked bounds what one package unpacks to (libc6, the largest here,
// unpacks to about 13 MB).
const maxDebUnpacked = 256 << 20

// readDeb reads a .deb (deb(5): an ar archive of debian-binary, control.tar.* and
// data.tar.*, each compressed with xz, zstd, gzip or not at all).
func readDeb(file string) (*debPackage, error) {
	members, err := debMembers(file)
	if err != nil {
		return nil, err
	}
	pkg := &debPackage{}
	var sawControl, sawData bool
	for name, body := range members {
		base, comp, _ := strings.Cut(name, ".tar")
		if base != "control" && base != "data" {
			continue
		}
		tarData, err := decompress(comp, body)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, name, err)
		}
		if base == "control" {
			sawControl = true
			err = pkg.readControlTar(tarData)
		} else {
			sawData = true
			err = pkg.readDataTar(tarData)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, name, err)
		}
	}
	if !sawControl || !sawData || pkg.Name() == "" {
		return nil, fmt.Errorf("%s: not a binary package (control.tar %v, data.tar %v, Package %q)", file, sawControl, sawData, pkg.Name())
	}
	return pkg, nil
}

// debMembers reads a .deb's ar members, checking its format version.
func debMembers(file string) (map[string][]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	members, err := readAr(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if v := strings.TrimSpace(string(members["debian-binary"])); !strings.HasPrefix(v, "2.") {
		return nil, fmt.Errorf("%s: debian-binary %q, want 2.x", file, v)
	}
	return members, nil
}

// readAr splits a common-format ar archive into its members.
func readAr(data []byte) (map[string][]byte, error) {
	const magic = "!<arch>\n"
	if !bytes.HasPrefix(data, []byte(magic)) {
		return nil, fmt.Errorf("not an ar archive")
	}
	out := map[string][]byte{}
	rest := data[len(magic):]
	for len(rest) > 0 {
		if len(rest) < 60 {
			return nil, fmt.Errorf("ar: truncated member header")
		}
		hdr := rest[:60]
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		var size int64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(hdr[48:58])), "%d", &size); err != nil || size < 0 {
			return nil, fmt.Errorf("ar: member %q: size %q", name, hdr[48:58])
		}
		rest = rest[60:]
		if int64(len(rest)) < size {
			return nil, fmt.Errorf("ar: member %q: %d bytes, %d left", name, size, len(rest))
		}
		out[name] = rest[:size]
		rest = rest[size:]
		if size%2 == 1 && len(rest) > 0 { // members are 2-byte aligned
			rest = rest[1:]
		}
	}
	return out, nil
}

func decompress(suffix string, body []byte) ([]byte, error) {
	r, done, err := decompressor(suffix, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer done()
	return readAllLimit(r, maxDebUnpacked)
}

// decompressor reads a .deb member compressed as its name's suffix says; done
// releases it.
func decompressor(suffix string, r io.Reader) (out io.Reader, done func(), err error) {
	switch suffix {
	case ".xz":
		xr, err := xz.NewReader(r)
		return xr, func() {}, err
	case ".zst":
		zr, err := zstd.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	case ".gz":
		gr, err := gzip.NewReader(r)
		return gr, func() {}, err
	case "":
		return r, func() {}, nil
	}
	return nil, nil, fmt.Errorf("compression %q is not one dpkg writes", suffix)
}

// extractDebFile returns one regular file of a .deb's data.tar, reading the
// archive as a stream (for packages too large to unpack whole in memory).
func extractDebFile(file, want string) ([]byte, error) {
	members, err := debMembers(file)
	if err != nil {
		return nil, err
	}
	for name, body := range members {
		base, comp, _ := strings.Cut(name, ".tar")
		if base != "data" {
			continue
		}
		r, done, err := decompressor(comp, bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, name, err)
		}
		defer done()
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return nil, fmt.Errorf("%s: no %s", file, want)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, name, err)
			}
			if path.Clean("/"+h.Name) == want && h.Typeflag == tar.TypeReg {
				return readAllLimit(tr, maxDebUnpacked)
			}
		}
	}
	return nil, fmt.Errorf("%s: no data.tar", file)
}

func readAllLimit(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("more than %d bytes uncompressed", limit)
	}
	return data, nil
}

func (p *debPackage) readControlTar(data []byte) error {
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		switch path.Clean(h.Name) {
		case "control":
			stanzas, err := parseControl(bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("control: %w", err)
			}
			if len(stanzas) != 1 {
				return fmt.Errorf("control: %d stanzas, want 1", len(stanzas))
			}
			p.Control = stanzas[0]
		case "md5sums":
			p.MD5sums = body
		case "conffiles":
			for _, l := range strings.Split(string(body), "\n") {
				if l = strings.TrimSpace(l); l != "" {
					p.Conffiles = append(p.Conffiles, l)
				}
			}
		}
	}
	return nil
}

func (p *debPackage) readDataTar(data []byte) error {
	tr := tar.NewReader(bytes.NewReader(data))
	byPath := map[string]int{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		e := debEntry{Path: name, Mode: h.Mode & 0o7777}
		switch h.Typeflag {
		case tar.TypeDir:
			e.Dir = true
		case tar.TypeSymlink:
			e.Link = h.Linkname
		case tar.TypeReg:
			if e.Data, err = io.ReadAll(tr); err != nil {
				return err
			}
		case tar.TypeLink: // a hard link: the same bytes again
			target := path.Clean("/" + h.Linkname)
			i, ok := byPath[target]
			if !ok {
				return fmt.Errorf("%s: hard link to %s, not before it in the archive", name, target)
			}
			e.Data = p.Entries[i].Data
		default:
			return fmt.Errorf("%s: entry type %c is not a file, directory or link", name, h.Typeflag)
		}
		byPath[name] = len(p.Entries)
		p.Entries = append(p.Entries, e)
	}
}

// mergedUsr maps a path to where it lives on a merged-/usr system (Debian 12's
// layout): /bin, /sbin and /lib* are links into /usr, so /lib/x goes to /usr/lib/x.
func mergedUsr(p string) string {
	for _, top := range mergedUsrDirs {
		if p == "/"+top || strings.HasPrefix(p, "/"+top+"/") {
			return "/usr" + p
		}
	}
	return p
}

// mergedUsrDirs are the top-level directories that are links into /usr.
var mergedUsrDirs = []string{"bin", "lib", "lib64", "sbin"}

// dropped says whether a packaged path is left out of the image, as Debian's own
// minimal container images do with dpkg's path-exclude: documentation (but not the
// copyright files, which carry the licences and which scanners read), manual
// pages, translations, and the iconv modules (none of the tools converts
// character sets). The package database lists only what is kept.
func dropped(p string) bool {
	for _, prefix := range []string{"/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/", "/usr/share/bug/"} {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(p, "/usr/share/doc/"); ok {
		_, file, nested := strings.Cut(rest, "/")
		return nested && file != "copyright"
	}
	return strings.Contains(p, "-linux-gnu/gconv/")
}

// installDebs lays the packages out as image files, as dpkg would install them on
// a merged-/usr system: their kept files (see dropped), the /bin, /sbin and /lib*
// links, and dpkg's database (/var/lib/dpkg/status with every package "install ok
// installed", and info/<package>.list and .md5sums, named <package>:<arch> for
// Multi-Arch: same packages, as dpkg does), which image scanners read to list the
// packages. Two packages shipping the same file is an error.
func installDebs(pkgs []*debPackage) ([]File, error) {
	var files []File
	owner := map[string]string{}
	for _, top := range mergedUsrDirs {
		files = append(files, File{Path: "/" + top, Link: "usr/" + top})
		owner["/"+top] = "merged /usr"
	}
	sorted := append([]*debPackage(nil), pkgs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name() < sorted[j].Name() })
	var status bytes.Buffer
	for _, p := range sorted {
		name := p.Name()
		var list []string
		byPath := map[string][]byte{}
		for _, e := range p.Entries {
			if dropped(mergedUsr(e.Path)) {
				continue
			}
			list = append(list, e.Path)
			if !e.Dir {
				byPath[e.Path] = e.Data
			}
			dst := mergedUsr(e.Path)
			if e.Dir {
				continue // directories are made for the files in them
			}
			if prev := owner[dst]; prev != "" {
				return nil, fmt.Errorf("debian packages: %s and %s both ship %s", prev, name, dst)
			}
			owner[dst] = name
			if e.Link != "" {
				files = append(files, File{Path: dst, Link: e.Link})
			} else {
				files = append(files, File{Path: dst, Data: e.Data, Mode: e.Mode})
			}
		}
		infoName := name
		if p.Control.Get("Multi-Arch") == "same" {
			infoName += ":" + p.Control.Get("Architecture")
		}
		info := "/var/lib/dpkg/info/" + infoName
		files = append(files, File{Path: info + ".list", Data: []byte("/.\n" + strings.Join(list, "\n") + "\n"), Mode: 0o644})
		if len(p.MD5sums) > 0 {
			files = append(files, File{Path: info + ".md5sums", Data: p.MD5sums, Mode: 0o644})
		}
		st := stanza{}
		for i, f := range p.Control {
			st = append(st, f)
			if i == 0 {
				st = append(st, controlField{"Status", "install ok installed"})
			}
		}
		if len(p.Conffiles) > 0 {
			var b strings.Builder
			for _, c := range p.Conffiles {
				sum := md5.Sum(byPath[c])
				fmt.Fprintf(&b, "\n %s %s", c, hex.EncodeToString(sum[:]))
			}
			st = append(st, controlField{"Conffiles", b.String()})
		}
		status.WriteString(st.String())
		status.WriteString("\n")
	}
	files = append(files, File{Path: "/var/lib/dpkg/status", Data: status.Bytes(), Mode: 0o644})
	return files, nil
}
