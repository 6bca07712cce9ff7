package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/istio-cni/istio-cni/internal/version"
)

// File is one entry of the image's layer: a copy of a host file, given bytes, or a
// symlink.
type File struct {
	// Path in the image, absolute.
	Path string
	// Source is the host file copied in; its mode keeps only the x bit (0755 or 0644).
	Source string
	// Data, when set instead of Source, is the file's content, with mode Mode.
	Data []byte
	Mode int64
	// Link, when set instead of Source or Data, makes Path a symlink to Link.
	Link string
}

// Spec describes an image.
type Spec struct {
	// Ref is the image's name, as pods refer to it: <hub>/<name>:<tag>.
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	// Env is the config's environment; empty means a PATH of /usr/local/bin:/usr/bin:/bin.
	Env []string
	// Arch is the image's architecture (GOARCH's names); empty means amd64.
	Arch string
	// Packages are the Debian packages some of Files come from, for the SBOM.
	Packages []LockedPackage
	// Labels are the config's labels (org.opencontainers.image.version, say).
	Labels map[string]string
}

// platform is the OCI platform of an image for arch: arm64 images are of the
// ARMv8 variant, as containerd and registries name them.
func platform(arch string) v1.Platform {
	if arch == "" {
		arch = "amd64"
	}
	p := v1.Platform{OS: "linux", Architecture: arch}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// epoch is every timestamp of the image: the same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

// Build makes a single-layer OCI image for linux/spec.Arch from spec.
func Build(spec Spec) (v1.Image, error) {
	if _, err := name.NewTag(spec.Ref, name.StrictValidation); err != nil {
		if _, err2 := name.NewTag(spec.Ref); err2 != nil {
			return nil, fmt.Errorf("image name %q: %w", spec.Ref, err)
		}
	}
	if len(spec.Files) == 0 {
		return nil, fmt.Errorf("image %s: no files", spec.Ref)
	}
	layerTar, err := layerTarball(spec.Files)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: make layer: %w", spec.Ref, err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "istio-cni hack/image"}})
	if err != nil {
		return nil, fmt.Errorf("image %s: append layer: %w", spec.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: read config: %w", spec.Ref, err)
	}
	cfg = cfg.DeepCopy()
	p := platform(spec.Arch)
	cfg.Architecture, cfg.OS, cfg.Variant = p.Architecture, p.OS, p.Variant
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = spec.Entrypoint
	cfg.Config.Cmd = spec.Cmd
	cfg.Config.Env = spec.Env
	cfg.Config.Labels = spec.Labels
	if len(cfg.Config.Env) == 0 {
		cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("image %s: set config: %w", spec.Ref, err)
	}
	return img, nil
}

// layerTarball writes files sorted by path, parents first, each directory once, all
// owned by root and dated at the epoch.
func layerTarball(files []File) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	seen := map[string]bool{}
	for _, f := range sorted {
		if !path.IsAbs(f.Path) {
			return nil, fmt.Errorf("%s: path in the image must be absolute", f.Path)
		}
		rel := strings.TrimPrefix(path.Clean(f.Path), "/")
		if seen[rel] {
			return nil, fmt.Errorf("%s: listed twice", f.Path)
		}
		seen[rel] = true
		parts := strings.Split(rel, "/")
		for i := 0; i < len(parts)-1; i++ {
			dir := strings.Join(parts[:i+1], "/") + "/"
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		switch {
		case f.Link != "" && (f.Source != "" || f.Data != nil), f.Source != "" && f.Data != nil:
			return nil, fmt.Errorf("%s: more than one of a source, data and a link", f.Path)
		case f.Link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: f.Link, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		case f.Source == "":
			if f.Mode&^0o7777 != 0 || f.Mode == 0 {
				return nil, fmt.Errorf("%s: mode %o is not a file's permission bits", f.Path, f.Mode)
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		default:
			data, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("read %s for %s: %w", f.Source, f.Path, err)
			}
			fi, err := os.Stat(f.Source)
			if err != nil {
				return nil, err
			}
			mode := int64(0o644)
			if fi.Mode().Perm()&0o111 != 0 {
				mode = 0o755
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ContainerdName is the name containerd's CRI gives ref: a name without a registry
// host is on docker.io, and one without a path is under library/.
func ContainerdName(ref string) string {
	first, rest, ok := strings.Cut(ref, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return ref
	}
	if !ok {
		return "docker.io/library/" + ref
	}
	return "docker.io/" + first + "/" + rest
}

// BuildIndex makes an OCI image index of one image per spec, each listed with its
// platform (linux/<Arch>), in the order given: what a registry serves for a
// multi-architecture name, and what a runtime picks its platform's image from.
func BuildIndex(specs []Spec) (v1.ImageIndex, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("image index: no images")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, spec := range specs {
		p := platform(spec.Arch)
		if seen[p.Architecture] {
			return nil, fmt.Errorf("image index %s: two images for %s", spec.Ref, p.Architecture)
		}
		seen[p.Architecture] = true
		img, err := Build(spec)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// Artifact is what WriteArchive writes: a v1.Image or a v1.ImageIndex.
type Artifact interface {
	Digest() (v1.Hash, error)
	MediaType() (types.MediaType, error)
	RawManifest() ([]byte, error)
}

// WriteArchive writes img (an image or an index) as an OCI image-layout archive
// (what `ctr images import` reads) to file, by rename. It is named ref in the
// archive's index.json, its only entry; every blob (manifests, configs, layers) is
// under blobs/sha256, written in digest order. The archive's bytes depend only on
// the artifact and ref.
func WriteArchive(file, ref string, img Artifact) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("image %s: manifest: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image %s: digest: %w", ref, err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	blobs := map[v1.Hash]blob{}
	if err := collectBlobs(img, blobs); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	tag := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		tag = ref[i+1:]
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     string(types.OCIImageIndex),
		"manifests": []any{map[string]any{
			"mediaType": string(mt),
			"digest":    digest.String(),
			"size":      len(manifest),
			"annotations": map[string]string{
				"io.containerd.image.name":          ContainerdName(ref),
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tmp := file + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(out)
	add := func(name string, data []byte) error {
		return writeEntry(tw, name, int64(len(data)), bytes.NewReader(data))
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	digests := make([]v1.Hash, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Slice(digests, func(i, j int) bool { return digests[i].Hex < digests[j].Hex })
	for _, d := range digests {
		b := blobs[d]
		rc, err := b.open()
		if err != nil {
			return fmt.Errorf("image %s: blob %s: %w", ref, d, err)
		}
		err = writeEntry(tw, "blobs/sha256/"+d.Hex, b.size, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("image %s: blob %s: %w", ref, d, err)
		}
	}
	if err := add("index.json", indexJSON); err != nil {
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// blob is one content-addressed file of an OCI layout.
type blob struct {
	size int64
	open func() (io.ReadCloser, error)
}

func bytesBlob(data []byte) blob {
	return blob{int64(len(data)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}
}

// collectBlobs adds the blobs of an image (manifest, config, layers) or an index
// (its manifest and each image's blobs) to blobs.
func collectBlobs(a Artifact, blobs map[v1.Hash]blob) error {
	manifest, err := a.RawManifest()
	if err != nil {
		return err
	}
	d, err := a.Digest()
	if err != nil {
		return err
	}
	blobs[d] = bytesBlob(manifest)
	switch a := a.(type) {
	case v1.ImageIndex:
		m, err := a.IndexManifest()
		if err != nil {
			return err
		}
		for _, desc := range m.Manifests {
			img, err := a.Image(desc.Digest)
			if err != nil {
				return fmt.Errorf("index entry %s: %w", desc.Digest, err)
			}
			if err := collectBlobs(img, blobs); err != nil {
				return err
			}
		}
	case v1.Image:
		config, err := a.RawConfigFile()
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		cfgName, err := a.ConfigName()
		if err != nil {
			return fmt.Errorf("config digest: %w", err)
		}
		blobs[cfgName] = bytesBlob(config)
		layers, err := a.Layers()
		if err != nil {
			return fmt.Errorf("layers: %w", err)
		}
		for _, l := range layers {
			ld, err := l.Digest()
			if err != nil {
				return err
			}
			size, err := l.Size()
			if err != nil {
				return err
			}
			blobs[ld] = blob{size, l.Compressed}
		}
	default:
		return fmt.Errorf("%T is neither an image nor an index", a)
	}
	return nil
}

func writeEntry(tw *tar.Writer, name string, size int64, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := io.Copy(tw, r)
	return err
}

// Import loads an archive WriteArchive wrote for ref (an image or an image index),
// with the ctr at ctrPath, into the containerd at socket, in the CRI's namespace
// (k8s.io), for this machine's platform, under its tag and as <repository>@<digest
// of the image or index> (what a registry resolves a digest reference to), so pods
// can run it by tag or by digest with imagePullPolicy IfNotPresent or Never.
// containerd 2.x's `ctr images import --digests` names the archive's index.json
// instead, which a pod's digest reference does not match: the digest name is made
// with `ctr images tag`.
func Import(ctx context.Context, ctrPath, socket, archive, ref string) error {
	repo := ContainerdName(ref)
	tag := repo
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	} else {
		tag = repo + ":latest"
	}
	digest, err := archiveManifestDigest(archive)
	if err != nil {
		return err
	}
	ctr := func(args ...string) error {
		out, err := exec.CommandContext(ctx, ctrPath, append([]string{"-a", socket, "-n", "k8s.io", "images"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := ctr("import", "--base-name", repo, "--platform", "linux/"+runtime.GOARCH, archive); err != nil {
		return err
	}
	return ctr("tag", "--force", tag, repo+"@"+digest)
}

// Limits on reading an OCI archive's index.json: the archive is this project's own
// build output, but a wrong file must fail, not be read to its end.
const (
	MaxArchiveEntries = 10000
	MaxIndexJSON      = 1 << 20
)

// ArchiveIndexJSON returns the index.json of an OCI archive (a tar), looked for
// among its first MaxArchiveEntries entries and read up to MaxIndexJSON bytes.
func ArchiveIndexJSON(archive string) ([]byte, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for range MaxArchiveEntries {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("image archive %s: no index.json: %w", archive, err)
		}
		if path.Clean(h.Name) != "index.json" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, MaxIndexJSON+1))
		if err != nil {
			return nil, fmt.Errorf("image archive %s: index.json: %w", archive, err)
		}
		if len(b) > MaxIndexJSON {
			return nil, fmt.Errorf("image archive %s: index.json is larger than %d bytes", archive, MaxIndexJSON)
		}
		return b, nil
	}
	return nil, fmt.Errorf("image archive %s: more than %d entries", archive, MaxArchiveEntries)
}

// archiveManifestDigest reads the digest of the one manifest (an image's or an
// index's) an OCI archive's index.json lists.
func archiveManifestDigest(archive string) (string, error) {
	b, err := ArchiveIndexJSON(archive)
	if err != nil {
		return "", err
	}
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(b, &index); err != nil {
		return "", fmt.Errorf("image archive %s: index.json: %w", archive, err)
	}
	if len(index.Manifests) != 1 || !strings.HasPrefix(index.Manifests[0].Digest, "sha256:") {
		return "", fmt.Errorf("image archive %s: index.json lists %d manifests, want one", archive, len(index.Manifests))
	}
	return index.Manifests[0].Digest, nil
}

// GoBuild builds the main packages pkgs (import paths or ./relative to moduleDir)
// into outDir as static, stripped, reproducible linux/<arch> binaries (GOARCH's
// names) of the build version ver (internal/version; empty: "dev"): CGO off,
// -trimpath, no build id and no VCS stamp, so the same sources and version give
// the same bytes wherever the checkout is. It returns binary name -> path.
func GoBuild(ctx context.Context, moduleDir, outDir, arch, ver string, pkgs ...string) (map[string]string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	if ver == "" {
		ver = version.Version
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid= " + version.LinkFlag(ver), "-o", outDir + "/"}
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		b := path.Base(p)
		full := filepath.Join(outDir, b)
		if _, err := os.Stat(full); err != nil {
			return nil, fmt.Errorf("go build %s: no %s: %w", p, full, err)
		}
		bins[b] = full
	}
	return bins, nil
}

// AgentBinaries are the main packages of the agent image.
var AgentBinaries = []string{"./cmd/install-cni", "./cmd/istio-cni", "./cmd/istio-iptables", "./cmd/istio-cni-doctor"}

// VersionLabel is the agent image's label that holds its build version (the
// binaries' internal/version.Version): images of two versions differ even where
// the sources do not.
const VersionLabel = "org.opencontainers.image.version"

// AgentPath is the agent image's PATH: our binaries, then the iptables and nft
// tools.
const AgentPath = "/usr/local/bin:/usr/sbin:/usr/bin"

// AgentSpec lays out the install-cni image for arch from the binaries GoBuild made
// of AgentBinaries for that arch: the plugin in /opt/cni/bin (the agent's
// CNI_BIN_SOURCE_DIR, every file of which it installs on the node), everything on
// PATH in /usr/local/bin, and the operating-system files: the Debian packages of
// debian.lock for arch (DebianFiles), which hold the iptables and nft tools the
// backends run inside the container (repair in place and the doctor), and the
// names the backends run them by.
func AgentSpec(ctx context.Context, ref, arch, ver string, bins map[string]string) (Spec, error) {
	for _, b := range []string{"install-cni", "istio-cni", "istio-iptables", "istio-cni-doctor"} {
		if bins[b] == "" {
			return Spec{}, fmt.Errorf("agent image: no %s binary", b)
		}
	}
	lock, err := LoadDebianLock()
	if err != nil {
		return Spec{}, err
	}
	osFiles, pkgs, err := DebianFiles(ctx, lock, arch)
	if err != nil {
		return Spec{}, err
	}
	files := []File{
		{Path: "/opt/cni/bin/istio-cni", Source: bins["istio-cni"]},
		{Path: "/usr/local/bin/istio-cni", Link: "/opt/cni/bin/istio-cni"},
		{Path: "/usr/local/bin/install-cni", Source: bins["install-cni"]},
		{Path: "/usr/local/bin/istio-iptables", Source: bins["istio-iptables"]},
		{Path: "/usr/local/bin/istio-cni-doctor", Source: bins["istio-cni-doctor"]},
	}
	// The names without a flavour are Debian's alternatives (update-alternatives,
	// run by iptables' postinst, which does not run here): the nft flavour, as on
	// current distributions.
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			files = append(files, File{Path: "/usr/sbin/" + fam + suffix, Link: fam + "-nft" + suffix})
		}
	}
	return Spec{
		Ref:        ref,
		Arch:       arch,
		Files:      append(files, osFiles...),
		Entrypoint: []string{"install-cni"},
		Env:        []string{"PATH=" + AgentPath},
		Packages:   pkgs,
		Labels:     map[string]string{VersionLabel: ver},
	}, nil
}

// DebianFiles downloads (or takes from the cache) the packages debian.lock pins for
// arch, checks that each is the package the lock names, and lays them out as
// image files with dpkg's database (installDebs).
func DebianFiles(ctx context.Context, lock *DebianLock, arch string) ([]File, []LockedPackage, error) {
	locked := lock.Packages[arch]
	if len(locked) == 0 {
		return nil, nil, fmt.Errorf("debian.lock: no packages for architecture %q (have %v)", arch, DebianArches)
	}
	var debs []*debPackage
	for _, lp := range locked {
		file, err := FetchDeb(ctx, lp)
		if err != nil {
			return nil, nil, err
		}
		p, err := readDeb(file)
		if err != nil {
			return nil, nil, fmt.Errorf("debian package %s %s: %w", lp.Name, lp.Version, err)
		}
		got := [3]string{p.Name(), p.Control.Get("Version"), p.Control.Get("Architecture")}
		if got != [3]string{lp.Name, lp.Version, lp.Arch} {
			return nil, nil, fmt.Errorf("debian package %s: %s is %v, the lock says %s %s %s", lp.Name, lp.URL, got, lp.Name, lp.Version, lp.Arch)
		}
		debs = append(debs, p)
	}
	files, err := installDebs(debs)
	if err != nil {
		return nil, nil, err
	}
	return files, locked, nil
}
