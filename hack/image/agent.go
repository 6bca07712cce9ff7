package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/istio-cni/istio-cni/internal/version"
)

// versionPattern is what a build version may be: an OCI tag's characters (so that
// `make push TAG=` can use it), at most 128 of them.
var versionPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// CheckVersion refuses a build version that is not a tag's characters (make image
// VERSION=, make push TAG=): it goes into -ldflags and the image's label.
func CheckVersion(v string) error {
	if !versionPattern.MatchString(v) {
		return fmt.Errorf("build version %q: want an image tag: 1 to 128 of A-Z a-z 0-9 _ . - (not starting with . or -)", v)
	}
	return nil
}

// Agent is the built agent image: one image per architecture of DebianArches and
// the index that lists them.
type Agent struct {
	Ref    string
	Specs  []Spec
	Index  v1.ImageIndex
	Distro string
}

// BuildAgent builds AgentBinaries of version ver (empty: "dev") for each of
// DebianArches into binDir/<arch> (GoBuild), lays out each architecture's image
// (AgentSpec) and makes their index.
func BuildAgent(ctx context.Context, moduleDir, binDir, ref, ver string) (*Agent, error) {
	if ver == "" {
		ver = version.Version
	}
	if err := CheckVersion(ver); err != nil {
		return nil, err
	}
	lock, err := LoadDebianLock()
	if err != nil {
		return nil, err
	}
	a := &Agent{Ref: ref, Distro: lock.Distro}
	for _, arch := range DebianArches {
		bins, err := GoBuild(ctx, moduleDir, filepath.Join(binDir, arch), arch, ver, AgentBinaries...)
		if err != nil {
			return nil, err
		}
		spec, err := AgentSpec(ctx, ref, arch, ver, bins)
		if err != nil {
			return nil, err
		}
		a.Specs = append(a.Specs, spec)
	}
	if a.Index, err = BuildIndex(a.Specs); err != nil {
		return nil, err
	}
	return a, nil
}

// WithEnv returns the agent image again with env added to each image's
// environment (another digest for the same files, as a rebuilt release has).
func (a *Agent) WithEnv(env ...string) (*Agent, error) {
	b := *a
	b.Specs = nil
	for _, s := range a.Specs {
		s.Env = append(append([]string(nil), s.Env...), env...)
		b.Specs = append(b.Specs, s)
	}
	var err error
	if b.Index, err = BuildIndex(b.Specs); err != nil {
		return nil, err
	}
	return &b, nil
}

// WithRef returns the agent image named ref (the same index).
func (a *Agent) WithRef(ref string) *Agent {
	b := *a
	b.Ref = ref
	b.Specs = nil
	for _, s := range a.Specs {
		s.Ref = ref
		b.Specs = append(b.Specs, s)
	}
	return &b
}

// Write writes the index as an OCI archive (WriteArchive) to dir/<name>_<tag>.oci.tar
// and its SBOM (SBOM) beside it, <name>_<tag>.spdx.json, and returns both paths.
func (a *Agent) Write(dir string) (archive, sbom string, err error) {
	base := filepath.Join(dir, filepath.Base(strings.ReplaceAll(a.Ref, ":", "_")))
	archive, sbom = base+".oci.tar", base+".spdx.json"
	if err := WriteArchive(archive, a.Ref, a.Index); err != nil {
		return "", "", err
	}
	doc, err := SBOM(a.Ref, a.Distro, a.Index, a.Specs)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(sbom, append(doc, '\n'), 0o644); err != nil {
		return "", "", fmt.Errorf("sbom: %w", err)
	}
	return archive, sbom, nil
}
