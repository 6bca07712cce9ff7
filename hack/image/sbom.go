package image

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The SBOM is an SPDX 2.3 JSON document written beside the image archive. It
// describes the image index and each platform's image, and lists what each image
// contains: its Debian packages (with the .deb's URL and SHA-256, and the package
// URL pkg:deb/debian/<name>@<version>?arch=<arch>&distro=<distro> that
// vulnerability databases key on) and the Go modules compiled into its binaries
// and the Go standard library (read from the binaries' build information,
// pkg:golang/<module>@<version>, pkg:golang/stdlib@go<version>).

// spdxDocument is the subset of SPDX 2.3's JSON form the SBOM uses.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID                string            `json:"SPDXID"`
	Name                  string            `json:"name"`
	VersionInfo           string            `json:"versionInfo,omitempty"`
	Supplier              string            `json:"supplier,omitempty"`
	DownloadLocation      string            `json:"downloadLocation"`
	FilesAnalyzed         bool              `json:"filesAnalyzed"`
	Checksums             []spdxChecksum    `json:"checksums,omitempty"`
	SourceInfo            string            `json:"sourceInfo,omitempty"`
	LicenseConcluded      string            `json:"licenseConcluded"`
	LicenseDeclared       string            `json:"licenseDeclared"`
	CopyrightText         string            `json:"copyrightText"`
	PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

const noAssertion = "NOASSERTION"

// SBOM writes the SPDX document of the index built from specs (BuildIndex) for
// ref. distro names the Debian release for the package URLs (debian-12). Its bytes
// depend only on its inputs: the creation time is the epoch, like the images'.
func SBOM(ref, distro string, index v1.ImageIndex, specs []Spec) ([]byte, error) {
	digest, err := index.Digest()
	if err != nil {
		return nil, err
	}
	im, err := index.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != len(specs) {
		return nil, fmt.Errorf("sbom %s: the index lists %d images, %d specs given", ref, len(im.Manifests), len(specs))
	}
	repo := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		repo = ref[:i]
	}
	name := repo[strings.LastIndex(repo, "/")+1:]
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              ref,
		DocumentNamespace: "https://github.com/istio-cni/istio-cni/spdx/" + name + "/" + digest.String(),
		CreationInfo:      spdxCreationInfo{Created: epoch.Format("2006-01-02T15:04:05Z"), Creators: []string{"Tool: istio-cni-hack-image", "Organization: istio-cni"}},
	}
	ociPurl := func(d v1.Hash, arch string) string {
		q := url.Values{"repository_url": {repo}}
		if arch != "" {
			q.Set("arch", arch)
		}
		return "pkg:oci/" + name + "@" + url.PathEscape(d.String()) + "?" + q.Encode()
	}
	indexID := "SPDXRef-Image-index"
	doc.Packages = append(doc.Packages, spdxPackage{
		SPDXID: indexID, Name: ref, VersionInfo: digest.String(), DownloadLocation: noAssertion,
		Checksums:        []spdxChecksum{{"SHA256", digest.Hex}},
		LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
		PrimaryPackagePurpose: "CONTAINER",
		ExternalRefs:          []spdxExternalRef{{"PACKAGE-MANAGER", "purl", ociPurl(digest, "")}},
	})
	doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", indexID})
	for i, spec := range specs {
		desc := im.Manifests[i]
		arch := platform(spec.Arch).Architecture
		if desc.Platform == nil || desc.Platform.Architecture != arch {
			return nil, fmt.Errorf("sbom %s: index entry %d is for %v, spec for %s", ref, i, desc.Platform, arch)
		}
		imageID := "SPDXRef-Image-" + arch
		doc.Packages = append(doc.Packages, spdxPackage{
			SPDXID: imageID, Name: ref + " linux/" + arch, VersionInfo: desc.Digest.String(), DownloadLocation: noAssertion,
			Checksums:        []spdxChecksum{{"SHA256", desc.Digest.Hex}},
			LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
			PrimaryPackagePurpose: "CONTAINER",
			ExternalRefs:          []spdxExternalRef{{"PACKAGE-MANAGER", "purl", ociPurl(desc.Digest, arch)}},
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{indexID, "CONTAINS", imageID})
		for _, p := range spec.Packages {
			id := spdxID("SPDXRef-DebianPackage-" + arch + "-" + p.Name)
			src := ""
			if p.Source != "" {
				src = "built from the Debian source package " + p.Source
			}
			doc.Packages = append(doc.Packages, spdxPackage{
				SPDXID: id, Name: p.Name, VersionInfo: p.Version, Supplier: "Organization: Debian",
				DownloadLocation: p.URL, Checksums: []spdxChecksum{{"SHA256", p.SHA256}}, SourceInfo: src,
				LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
				PrimaryPackagePurpose: "OPERATING-SYSTEM",
				ExternalRefs:          []spdxExternalRef{{"PACKAGE-MANAGER", "purl", DebPurl(p, distro)}},
			})
			doc.Relationships = append(doc.Relationships, spdxRelationship{imageID, "CONTAINS", id})
		}
		mods, err := goModules(spec)
		if err != nil {
			return nil, fmt.Errorf("sbom %s: %w", ref, err)
		}
		for _, m := range mods {
			id := spdxID("SPDXRef-GoModule-" + arch + "-" + m.Path + "-" + m.Version)
			doc.Packages = append(doc.Packages, spdxPackage{
				SPDXID: id, Name: m.Path, VersionInfo: m.Version, DownloadLocation: noAssertion,
				LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
				PrimaryPackagePurpose: "LIBRARY",
				ExternalRefs:          []spdxExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + url.PathEscape(m.Version)}},
			})
			doc.Relationships = append(doc.Relationships, spdxRelationship{imageID, "CONTAINS", id})
		}
	}
	return json.MarshalIndent(doc, "", "  ")
}

// DebPurl is the package URL of a Debian package, as vulnerability scanners and
// databases write it: the version percent-encoded ("+" as %2B, the epoch's ":" as
// %3A).
func DebPurl(p LockedPackage, distro string) string {
	return "pkg:deb/debian/" + p.Name + "@" + purlEscape(p.Version) + "?arch=" + p.Arch + "&distro=" + distro
}

// purlEscape percent-encodes what the package-URL spec does not allow as is in a
// version: anything but letters, digits and . - _ ~.
func purlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-_~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// spdxID makes an SPDX identifier: letters, digits, "." and "-" only.
func spdxID(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, s)
}

// goModule is one module compiled into a binary.
type goModule struct{ Path, Version string }

// goModules reads the build information of every Go binary among spec's files
// and returns their modules (the main module and each dependency, replacements
// resolved), each once, sorted.
func goModules(spec Spec) ([]goModule, error) {
	seen := map[string]goModule{}
	for _, f := range spec.Files {
		if f.Source == "" {
			continue
		}
		bi, err := buildinfo.ReadFile(f.Source)
		if err != nil {
			if _, serr := os.Stat(f.Source); serr != nil {
				return nil, serr
			}
			continue // not a Go binary
		}
		add := func(m goModule) { seen[m.Path+"@"+m.Version] = m }
		main := bi.Main.Version
		if main == "" {
			main = "(devel)"
		}
		add(goModule{bi.Main.Path, main})
		// The standard library, as scanners name it: its version is the toolchain's.
		add(goModule{"stdlib", bi.GoVersion})
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			add(goModule{d.Path, d.Version})
		}
	}
	out := make([]goModule, 0, len(seen))
	for _, m := range seen {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path+"@"+out[i].Version < out[j].Path+"@"+out[j].Version })
	return out, nil
}
