package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/istio-cni/istio-cni/hack/image"
)

// Limits on what push reads from an image archive: it is our own build's output,
// but a wrong file must fail, not fill the disk.
const (
	maxArchiveEntries = image.MaxArchiveEntries
	maxArchiveBytes   = 4 << 30
	maxIndexJSON      = image.MaxIndexJSON
)

// artifact is what push uploads under one tag: an image, or an index of images
// (a multi-arch image).
type artifact struct {
	image v1.Image
	index v1.ImageIndex
}

func (a artifact) digest() (v1.Hash, error) {
	if a.index != nil {
		return a.index.Digest()
	}
	return a.image.Digest()
}

// kind says what the artifact is, for the output: "a single image" or "an index
// of N manifests (platforms)".
func (a artifact) kind() string {
	if a.index == nil {
		return "a single image"
	}
	m, err := a.index.IndexManifest()
	if err != nil {
		return "index"
	}
	var platforms []string
	for _, d := range m.Manifests {
		if d.Platform != nil {
			platforms = append(platforms, d.Platform.String())
		}
	}
	return fmt.Sprintf("an index of %d manifests (%s)", len(m.Manifests), strings.Join(platforms, ", "))
}

// layoutIndex is index.json of an OCI image layout, as far as we read it.
type layoutIndex struct {
	Manifests []v1.Descriptor `json:"manifests"`
}

// findArchive picks, among the OCI archives (*.tar) and layout directories in dir,
// the one whose index.json names an image of repository name (…/install-cni): what
// `make image` wrote, whatever the file is called. An index.json that names no
// image at all is picked by the file's name (install-cni…).
func findArchive(dir, repoName string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("image directory (run make image first): %w", err)
	}
	var found, seen []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		var idx *layoutIndex
		switch {
		case e.IsDir():
			idx, err = readLayoutIndexDir(p)
		case strings.HasSuffix(e.Name(), ".tar"):
			idx, err = readLayoutIndexTar(p)
		default:
			continue
		}
		if err != nil {
			continue // not an OCI layout
		}
		names := refNames(idx)
		seen = append(seen, fmt.Sprintf("%s (%s)", e.Name(), strings.Join(names, ", ")))
		named := len(names) == 0 && strings.HasPrefix(e.Name(), repoName) // no name inside: the file's name says
		for _, n := range names {
			named = named || repositoryName(n) == repoName
		}
		if named {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no OCI archive in %s names a %s image (run make image first); found: %s", dir, repoName, orNone(seen))
	}
	return "", fmt.Errorf("%d OCI archives in %s name a %s image (%s): pass one with -archive", len(found), dir, repoName, strings.Join(found, ", "))
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, "; ")
}

// refNames are the image names index.json's entries carry (containerd's and OCI's
// annotations).
func refNames(idx *layoutIndex) []string {
	var out []string
	for _, d := range idx.Manifests {
		for _, k := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
			if v := d.Annotations[k]; v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

// repositoryName is the last path element of an image name without tag or digest:
// "istio-cni.local/install-cni:dev" -> "install-cni"; "" for what is no image name.
func repositoryName(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ""
	}
	return path.Base(r.Context().RepositoryStr())
}

func readLayoutIndexDir(dir string) (*layoutIndex, error) {
	f, err := os.Open(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decodeLayoutIndex(f)
}

func readLayoutIndexTar(file string) (*layoutIndex, error) {
	b, err := image.ArchiveIndexJSON(file)
	if err != nil {
		return nil, err
	}
	return decodeLayoutIndex(bytes.NewReader(b))
}

func decodeLayoutIndex(r io.Reader) (*layoutIndex, error) {
	var idx layoutIndex
	if err := json.NewDecoder(io.LimitReader(r, maxIndexJSON)).Decode(&idx); err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	return &idx, nil
}

// extract unpacks an OCI archive into dir: regular files and directories only, every
// path inside dir.
func extract(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		if n >= maxArchiveEntries {
			return fmt.Errorf("%s: more than %d entries", archive, maxArchiveEntries)
		}
		clean := path.Clean(h.Name)
		if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("%s: entry %q leaves the archive", archive, h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(clean))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += h.Size; total > maxArchiveBytes {
				return fmt.Errorf("%s: more than %d bytes", archive, int64(maxArchiveBytes))
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, io.LimitReader(tr, h.Size))
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %s: %w", archive, h.Name, err)
			}
		default:
			return fmt.Errorf("%s: entry %q is neither a file nor a directory", archive, h.Name)
		}
	}
}

// loadArtifact reads what an OCI layout (a directory, or an archive unpacked into
// work) holds: index.json listing one image gives that image, listing one index (a
// multi-arch image) gives that index, and listing several images, one per platform,
// gives index.json itself as the index.
func loadArtifact(src, work string) (artifact, error) {
	dir := src
	if fi, err := os.Stat(src); err != nil {
		return artifact{}, err
	} else if !fi.IsDir() {
		dir = filepath.Join(work, "layout")
		if err := extract(src, dir); err != nil {
			return artifact{}, err
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return artifact{}, fmt.Errorf("%s: not an OCI image layout: %w", src, err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		return artifact{}, fmt.Errorf("%s: %w", src, err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return artifact{}, fmt.Errorf("%s: index.json: %w", src, err)
	}
	switch {
	case len(m.Manifests) == 0:
		return artifact{}, fmt.Errorf("%s: index.json lists no image", src)
	case len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsIndex():
		idx, err := root.ImageIndex(m.Manifests[0].Digest)
		if err != nil {
			return artifact{}, fmt.Errorf("%s: %w", src, err)
		}
		return artifact{index: idx}, nil
	case len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsImage():
		img, err := root.Image(m.Manifests[0].Digest)
		if err != nil {
			return artifact{}, fmt.Errorf("%s: %w", src, err)
		}
		return artifact{image: img}, nil
	}
	platforms := map[string]bool{}
	for _, d := range m.Manifests {
		if !d.MediaType.IsImage() || d.Platform == nil {
			return artifact{}, fmt.Errorf("%s: index.json lists %d entries; with more than one, each must be an image with its platform (%s is %s)", src, len(m.Manifests), d.Digest, d.MediaType)
		}
		if platforms[d.Platform.String()] {
			return artifact{}, fmt.Errorf("%s: index.json lists two images for %s", src, d.Platform)
		}
		platforms[d.Platform.String()] = true
	}
	// index.json's entries carry the layout's name annotations, which are not part
	// of the pushed index: a copy without them.
	var adds []mutate.IndexAddendum
	for _, d := range m.Manifests {
		img, err := root.Image(d.Digest)
		if err != nil {
			return artifact{}, fmt.Errorf("%s: %w", src, err)
		}
		desc := d
		desc.Annotations = nil
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: desc})
	}
	return artifact{index: mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)}, nil
}
