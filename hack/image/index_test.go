package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// unpackLayout unpacks an image archive into a temporary directory and returns the
// OCI layout, its top index (index.json) and that index's manifest.
func unpackLayout(t *testing.T, archive string) (layout.Path, v1.ImageIndex, *v1.IndexManifest) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	untar(t, f, dir)
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return lp, top, m
}

// archiveIndex unpacks an agent archive and returns the image index it names.
func archiveIndex(t *testing.T, archive string) v1.ImageIndex {
	t.Helper()
	_, top, m := unpackLayout(t, archive)
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json lists %+v, want one image index", m.Manifests)
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// layerFiles reads an image's single layer: regular files' contents and links.
func layerFiles(t *testing.T, img v1.Image) (files map[string][]byte, links map[string]string, compressed int64) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v (%d)", err, len(layers))
	}
	if compressed, err = layers[0].Size(); err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files, links = map[string][]byte{}, map[string]string{}
	eachTarEntry(t, rc, func(h *tar.Header, body io.Reader) {
		switch h.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(body)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+h.Name] = data
		case tar.TypeSymlink:
			links["/"+h.Name] = h.Linkname
		}
	})
	return files, links, compressed
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// The archive holds an index of a linux/amd64 and a linux/arm64 image. In each,
// every ELF file (our Go binaries, the Debian tools, libraries and the loader) is
// for that image's architecture, and dpkg's database lists exactly the locked
// packages of that architecture, installed, each with its file list and copyright;
// /etc/os-release says which Debian release they come from.
func TestAgentIndexHoldsBothArchitectures(t *testing.T) {
	a, archive, _ := agentBuild(t)
	idx := archiveIndex(t, archive)
	want, _ := a.Index.Digest()
	if got, _ := idx.Digest(); got != want {
		t.Fatalf("the archive's index is %s, the built one %s", got, want)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.String())
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64/v8"}, platforms); diff != "" {
		t.Fatalf("index platforms (-want +got):\n%s", diff)
	}
	lock, err := LoadDebianLock()
	if err != nil {
		t.Fatal(err)
	}
	for i, arch := range DebianArches {
		img, err := idx.Image(m.Manifests[i].Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != arch {
			t.Errorf("%s image config: %s/%s", arch, cfg.OS, cfg.Architecture)
		}
		files, links, compressed := layerFiles(t, img)
		var elfs int
		var size int
		for p, data := range files {
			size += len(data)
			f, err := elf.NewFile(bytes.NewReader(data))
			if err != nil {
				continue
			}
			elfs++
			if f.Machine != elfMachine[arch] {
				t.Errorf("%s image: %s is an ELF file for %s", arch, p, f.Machine)
			}
		}
		for _, b := range []string{"/usr/local/bin/install-cni", "/opt/cni/bin/istio-cni", "/usr/sbin/xtables-nft-multi", "/usr/sbin/nft"} {
			if _, ok := files[b]; !ok {
				t.Errorf("%s image: no %s", arch, b)
			}
		}
		t.Logf("%s: %s, %d files (%d ELF) and %d links, %.1f MB, layer %.1f MB compressed", arch, m.Manifests[i].Digest, len(files), elfs, len(links), float64(size)/1e6, float64(compressed)/1e6)

		stanzas, err := parseControl(bytes.NewReader(files["/var/lib/dpkg/status"]))
		if err != nil {
			t.Fatalf("%s: dpkg status: %v", arch, err)
		}
		var got, wantPkgs []string
		for _, s := range stanzas {
			got = append(got, fmt.Sprintf("%s %s %s %s", s.Get("Package"), s.Get("Version"), s.Get("Architecture"), s.Get("Status")))
			info := "/var/lib/dpkg/info/" + s.Get("Package")
			if s.Get("Multi-Arch") == "same" {
				info += ":" + arch
			}
			if _, ok := files[info+".list"]; !ok {
				t.Errorf("%s: no %s.list", arch, info)
			}
			doc := "/usr/share/doc/" + s.Get("Package")
			if target, ok := links[doc]; ok { // a package whose doc directory is another's
				doc = "/usr/share/doc/" + target
			}
			if _, ok := files[doc+"/copyright"]; !ok {
				t.Errorf("%s: no %s/copyright", arch, doc)
			}
		}
		for _, p := range lock.Packages[arch] {
			wantPkgs = append(wantPkgs, fmt.Sprintf("%s %s %s install ok installed", p.Name, p.Version, p.Arch))
		}
		if diff := cmp.Diff(wantPkgs, got); diff != "" {
			t.Errorf("%s: dpkg status (-locked +image):\n%s", arch, diff)
		}
		osRelease := string(files["/usr/lib/os-release"])
		if links["/etc/os-release"] != "../usr/lib/os-release" || !strings.Contains(osRelease, "ID=debian") || !strings.Contains(osRelease, `VERSION_ID="12"`) {
			t.Errorf("%s: /etc/os-release -> %q, /usr/lib/os-release:\n%s", arch, links["/etc/os-release"], osRelease)
		}
	}
}

// syftTool builds syft (first run only) with hack/tools/install.sh and returns it.
func syftTool(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot(t), "hack/tools/install.sh"), "syft")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/tools/install.sh syft: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "syft")
}

// syftReport is the part of syft's JSON output the tests read.
type syftReport struct {
	Artifacts []struct {
		Name, Version, Type, PURL string
	} `json:"artifacts"`
	Distro struct {
		ID        string `json:"id"`
		VersionID string `json:"versionID"`
	} `json:"distro"`
}

func runSyft(t *testing.T, args ...string) syftReport {
	t.Helper()
	cmd := exec.Command(syftTool(t), args...)
	// syft checks for a newer release, reads its config from the home directory
	// and unpacks the archive under TMPDIR: all kept to the test.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "SYFT_CHECK_FOR_APP_UPDATE=false", "HOME="+tmp, "TMPDIR="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("syft %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var r syftReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("syft %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// byType lists a report's packages of one type as "name version", sorted.
func (r syftReport) byType(typ string) []string {
	var out []string
	for _, a := range r.Artifacts {
		if a.Type == typ {
			out = append(out, a.Name+" "+a.Version)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// A scanner reads the image's package list: syft, given the archive and a
// platform, finds Debian 12 and lists exactly the locked Debian packages of that
// architecture with their versions, and the same Go modules as the SBOM. Read back
// by syft, the SBOM lists the same Debian packages (with the same package URLs)
// and Go modules.
func TestScannerListsTheImagePackages(t *testing.T) {
	_, archive, sbom := agentBuild(t)
	lock, err := LoadDebianLock()
	if err != nil {
		t.Fatal(err)
	}
	fromSBOM := runSyft(t, "convert", sbom, "-o", "syft-json")
	for _, arch := range DebianArches {
		r := runSyft(t, "scan", "oci-archive:"+archive, "--platform", "linux/"+arch, "-o", "syft-json", "-q")
		// syft takes the point release from /etc/debian_version (12.15).
		if r.Distro.ID+"-"+r.Distro.VersionID != lock.Distro && !strings.HasPrefix(r.Distro.ID+"-"+r.Distro.VersionID, lock.Distro+".") {
			t.Errorf("%s: syft finds distro %+v, want %s", arch, r.Distro, lock.Distro)
		}
		var want []string
		for _, p := range lock.Packages[arch] {
			want = append(want, p.Name+" "+p.Version)
		}
		debs := r.byType("deb")
		if diff := cmp.Diff(want, debs); diff != "" {
			t.Errorf("%s: Debian packages syft lists (-locked +syft):\n%s", arch, diff)
		}
		t.Logf("%s: syft lists %d Debian packages: %s", arch, len(debs), strings.Join(debs, ", "))
		var purls []string
		for _, a := range r.Artifacts {
			if a.Type == "deb" {
				purls = append(purls, a.PURL)
			}
		}
		for _, p := range lock.Packages[arch] {
			// syft adds qualifiers of its own (upstream=); the name, version, arch
			// and distro are the same.
			ours := DebPurl(p, lock.Distro)
			found := false
			for _, theirs := range purls {
				base, q, _ := strings.Cut(theirs, "?")
				if base == strings.Split(ours, "?")[0] && strings.Contains(q, "arch="+p.Arch) && strings.Contains(q, "distro="+lock.Distro) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: SBOM package URL %s not among syft's: %v", arch, ours, purls)
			}
		}
		goMods := r.byType("go-module")
		if len(goMods) < 10 {
			t.Errorf("%s: syft lists %d Go modules: %v", arch, len(goMods), goMods)
		}
		for _, m := range goMods {
			if !slices.Contains(fromSBOM.byType("go-module"), m) && !strings.HasPrefix(m, "github.com/istio-cni/istio-cni ") {
				t.Errorf("%s: syft finds Go module %s in the image, the SBOM does not list it", arch, m)
			}
		}
	}
	// The SBOM covers both architectures: the union of their packages.
	var want []string
	for _, arch := range DebianArches {
		for _, p := range lock.Packages[arch] {
			want = append(want, p.Name+" "+p.Version)
		}
	}
	sort.Strings(want)
	if diff := cmp.Diff(slices.Compact(want), fromSBOM.byType("deb")); diff != "" {
		t.Errorf("Debian packages syft reads from the SBOM (-locked +syft):\n%s", diff)
	}
}

// The SBOM is a well-formed SPDX 2.3 document: the required document and package
// fields are set, identifiers are unique and well formed, every relationship joins
// two of its elements, every package is reached from the document, and each
// Debian package carries its .deb's SHA-256 and package URL.
func TestSBOMIsWellFormedSPDX(t *testing.T) {
	a, _, sbom := agentBuild(t)
	data, err := os.ReadFile(sbom)
	if err != nil {
		t.Fatal(err)
	}
	var doc spdxDocument
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if problems := checkSPDX(doc); len(problems) > 0 {
		t.Errorf("SBOM problems:\n%s", strings.Join(problems, "\n"))
	}
	debs := 0
	for _, p := range doc.Packages {
		if p.PrimaryPackagePurpose == "OPERATING-SYSTEM" {
			debs++
		}
	}
	lock, _ := LoadDebianLock()
	if want := len(lock.Packages["amd64"]) + len(lock.Packages["arm64"]); debs != want {
		t.Errorf("SBOM lists %d Debian packages, the lock %d", debs, want)
	}
	d, _ := a.Index.Digest()
	if doc.Packages[0].VersionInfo != d.String() {
		t.Errorf("SBOM describes %s, the index is %s", doc.Packages[0].VersionInfo, d)
	}
	// A broken document is caught.
	doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-Image-amd64", "CONTAINS", "SPDXRef-nothing"})
	doc.Packages[1].SPDXID = doc.Packages[0].SPDXID
	if problems := checkSPDX(doc); len(problems) < 2 {
		t.Errorf("a broken SBOM passes the checks: %v", problems)
	}
}

// checkSPDX lists what is wrong with an SPDX 2.3 document of the form SBOM writes.
func checkSPDX(doc spdxDocument) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if doc.SPDXVersion != "SPDX-2.3" || doc.DataLicense != "CC0-1.0" || doc.SPDXID != "SPDXRef-DOCUMENT" {
		bad("document header: %s %s %s", doc.SPDXVersion, doc.DataLicense, doc.SPDXID)
	}
	if doc.Name == "" || !strings.HasPrefix(doc.DocumentNamespace, "https://") || strings.Contains(doc.DocumentNamespace, "#") {
		bad("document name %q namespace %q", doc.Name, doc.DocumentNamespace)
	}
	if doc.CreationInfo.Created != "1970-01-01T00:00:00Z" || len(doc.CreationInfo.Creators) == 0 {
		bad("creation info %+v", doc.CreationInfo)
	}
	for _, c := range doc.CreationInfo.Creators {
		if !strings.HasPrefix(c, "Tool: ") && !strings.HasPrefix(c, "Organization: ") && !strings.HasPrefix(c, "Person: ") {
			bad("creator %q", c)
		}
	}
	ids := map[string]bool{"SPDXRef-DOCUMENT": true}
	for _, p := range doc.Packages {
		if ids[p.SPDXID] {
			bad("SPDXID %s twice", p.SPDXID)
		}
		ids[p.SPDXID] = true
		if !strings.HasPrefix(p.SPDXID, "SPDXRef-") || strings.Trim(p.SPDXID[len("SPDXRef-"):], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != "" {
			bad("SPDXID %q", p.SPDXID)
		}
		if p.Name == "" || p.DownloadLocation == "" || p.LicenseConcluded == "" || p.LicenseDeclared == "" || p.CopyrightText == "" {
			bad("%s: a required field is empty: %+v", p.SPDXID, p)
		}
		for _, c := range p.Checksums {
			if c.Algorithm != "SHA256" || len(c.ChecksumValue) != 64 || strings.Trim(c.ChecksumValue, "0123456789abcdef") != "" {
				bad("%s: checksum %+v", p.SPDXID, c)
			}
		}
		purls := 0
		for _, r := range p.ExternalRefs {
			if r.ReferenceCategory != "PACKAGE-MANAGER" || r.ReferenceType != "purl" || !strings.HasPrefix(r.ReferenceLocator, "pkg:") {
				bad("%s: external ref %+v", p.SPDXID, r)
			}
			purls++
		}
		if purls != 1 {
			bad("%s: %d package URLs", p.SPDXID, purls)
		}
		if p.PrimaryPackagePurpose == "OPERATING-SYSTEM" && (len(p.Checksums) != 1 || !strings.HasPrefix(p.DownloadLocation, "http") || !strings.HasPrefix(p.ExternalRefs[0].ReferenceLocator, "pkg:deb/debian/")) {
			bad("%s: a Debian package without its .deb's digest, URL or package URL: %+v", p.SPDXID, p)
		}
	}
	reached := map[string]bool{"SPDXRef-DOCUMENT": true}
	for _, r := range doc.Relationships {
		if !ids[r.SPDXElementID] || !ids[r.RelatedSPDXElement] {
			bad("relationship %+v joins an unknown element", r)
		}
		if r.RelationshipType != "DESCRIBES" && r.RelationshipType != "CONTAINS" {
			bad("relationship type %q", r.RelationshipType)
		}
		if reached[r.SPDXElementID] { // relationships are written parents first
			reached[r.RelatedSPDXElement] = true
		}
	}
	for id := range ids {
		if !reached[id] {
			bad("%s is not reached from the document", id)
		}
	}
	return out
}
