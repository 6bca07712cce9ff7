package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// buildImage writes a single-layer linux/amd64 image holding files (path in image ->
// path on host) as a docker-archive tarball that `ctr images import` reads. The
// layer is reproducible: entries are sorted, owned by root and dated at the epoch.
func buildImage(ref, out string, files map[string]string, entrypoint []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	layerTar, err := layerTarball(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = "amd64"
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Entrypoint = entrypoint
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

func layerTarball(files map[string]string) ([]byte, error) {
	dsts := make([]string, 0, len(files))
	for dst := range files {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, dst := range dsts {
		rel := strings.TrimPrefix(path.Clean(dst), "/")
		// Parent directories first, each once.
		for i, parts := 0, strings.Split(rel, "/"); i < len(parts)-1; i++ {
			dir := strings.Join(parts[:i+1], "/") + "/"
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		src := files[dst]
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("read %s for %s: %w", src, dst, err)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		mode := int64(0o644)
		if fi.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
