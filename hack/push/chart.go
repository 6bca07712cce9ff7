package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// Helm's media types for a chart stored in an OCI registry (what `helm push` writes
// and `helm pull`/`helm install oci://` read).
const (
	helmConfigMediaType types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	helmChartMediaType  types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// Limits on the chart archive helm package writes (ours is about 30 files, 100 kB).
const (
	maxChartEntries = 1000
	maxChartBytes   = 16 << 20
)

// semver is SemVer 2.0.0 without build metadata ('+' cannot be in an OCI tag): what
// a chart's version must be.
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?$`)

// chartVersionFor is the chart version that goes with image tag: the tag itself
// without a leading "v" (v1.2.3 -> 1.2.3), or explicit when given. It must be SemVer.
func chartVersionFor(tag, explicit string) (string, error) {
	if explicit != "" {
		if !semver.MatchString(explicit) {
			return "", fmt.Errorf("CHART_VERSION %q is not a SemVer version (MAJOR.MINOR.PATCH[-PRERELEASE], no +BUILD)", explicit)
		}
		return explicit, nil
	}
	v := strings.TrimPrefix(tag, "v")
	if !semver.MatchString(v) {
		return "", fmt.Errorf("TAG %q gives no chart version: a chart's version must be SemVer (MAJOR.MINOR.PATCH[-PRERELEASE]); use such a TAG or set CHART_VERSION=1.0.0", tag)
	}
	return v, nil
}

// chartDefaults are the values the packaged chart defaults to: the image pushed with it.
type chartDefaults struct {
	Hub, Tag, Digest string
}

// setValues rewrites the top-level keys hub, tag and digest of a values.yaml to d,
// keeping every comment and every other line as it is. Each key must be there once.
func setValues(values []byte, d chartDefaults) ([]byte, error) {
	lines := strings.SplitAfter(string(values), "\n")
	for _, kv := range []struct{ key, value string }{{"hub", d.Hub}, {"tag", d.Tag}, {"digest", d.Digest}} {
		found := 0
		for i, l := range lines {
			if rest, ok := strings.CutPrefix(l, kv.key+":"); ok {
				found++
				// An anchor on the key (hub: &hub, which defaultHub refers to) stays.
				anchor := ""
				if f := strings.Fields(rest); len(f) > 0 && strings.HasPrefix(f[0], "&") {
					anchor = f[0] + " "
				}
				lines[i] = kv.key + ": " + anchor + strconv.Quote(kv.value) + "  # set by make push\n"
			}
		}
		if found != 1 {
			return nil, fmt.Errorf("values.yaml: %d top-level %q keys, want one", found, kv.key)
		}
	}
	return []byte(strings.Join(lines, "")), nil
}

// packageChart copies the chart in chartDir into work, makes its values default to
// the pushed image (setValues), runs `helm package` with version and appVersion,
// and returns the archive rewritten reproducibly (normalizeChart).
func packageChart(ctx context.Context, helm, chartDir, work, version string, d chartDefaults) ([]byte, error) {
	src, err := filepath.Abs(chartDir)
	if err != nil {
		return nil, err
	}
	dst := filepath.Join(work, "chart", filepath.Base(src))
	err = filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case e.IsDir():
			return os.MkdirAll(target, 0o755)
		case e.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if rel == "values.yaml" {
				if data, err = setValues(data, d); err != nil {
					return fmt.Errorf("chart %s: %w", chartDir, err)
				}
			}
			return os.WriteFile(target, data, 0o644)
		}
		return fmt.Errorf("chart %s: %s is neither a file nor a directory", chartDir, rel)
	})
	if err != nil {
		return nil, err
	}
	out := filepath.Join(work, "packaged")
	cmd := exec.CommandContext(ctx, helm, "package", dst, "--version", version, "--app-version", d.Tag, "--destination", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("helm package: %w: %s", err, strings.TrimSpace(string(b)))
	}
	tgzs, _ := filepath.Glob(filepath.Join(out, "*.tgz"))
	if len(tgzs) != 1 {
		return nil, fmt.Errorf("helm package wrote %d archives into %s, want one", len(tgzs), out)
	}
	f, err := os.Open(tgzs[0])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return normalizeChart(f)
}

// normalizeChart rewrites a chart archive so that the same chart gives the same
// bytes: helm package dates every entry at the time it runs. Entries keep their
// order, names, modes and contents; every time is the epoch, every owner root, and
// the gzip header carries no name or time.
func normalizeChart(r io.Reader) ([]byte, error) {
	zr, err := gzip.NewReader(io.LimitReader(r, maxChartBytes))
	if err != nil {
		return nil, fmt.Errorf("chart archive: %w", err)
	}
	tr := tar.NewReader(zr)
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("chart archive: %w", err)
		}
		if n >= maxChartEntries {
			return nil, fmt.Errorf("chart archive: more than %d entries", maxChartEntries)
		}
		if total += h.Size; total > maxChartBytes {
			return nil, fmt.Errorf("chart archive: more than %d bytes", maxChartBytes)
		}
		nh := &tar.Header{Typeflag: h.Typeflag, Name: h.Name, Linkname: h.Linkname, Mode: h.Mode, Size: h.Size, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(nh); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// chartMetadata reads Chart.yaml out of a chart archive, as JSON (helm's OCI config
// blob is the chart's metadata in JSON, with Chart.yaml's field names).
func chartMetadata(tgz []byte) (name, version string, config []byte, err error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return "", "", nil, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", "", nil, fmt.Errorf("chart archive: no Chart.yaml: %w", err)
		}
		if strings.Count(h.Name, "/") != 1 || path.Base(h.Name) != "Chart.yaml" {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(tr, 1<<20))
		if err != nil {
			return "", "", nil, err
		}
		var meta map[string]any
		if err := yaml.Unmarshal(data, &meta); err != nil {
			return "", "", nil, fmt.Errorf("chart archive: Chart.yaml: %w", err)
		}
		name, _ := meta["name"].(string)
		version, _ := meta["version"].(string)
		if name == "" || version == "" {
			return "", "", nil, fmt.Errorf("chart archive: Chart.yaml has no name or version")
		}
		config, err := json.Marshal(meta) // map keys sorted: the same chart, the same bytes
		return name, version, config, err
	}
}

// chartArtifact is the chart archive as helm stores it in a registry: an OCI
// manifest whose config is the chart's metadata and whose one layer is the archive.
func chartArtifact(tgz []byte) (artifact, string, string, error) {
	name, version, config, err := chartMetadata(tgz)
	if err != nil {
		return artifact{}, "", "", err
	}
	layer := static.NewLayer(tgz, helmChartMediaType)
	ld, err := layer.Digest()
	if err != nil {
		return artifact{}, "", "", err
	}
	cd, cs, err := v1.SHA256(bytes.NewReader(config))
	if err != nil {
		return artifact{}, "", "", err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: helmConfigMediaType, Digest: cd, Size: cs},
		Layers:        []v1.Descriptor{{MediaType: helmChartMediaType, Digest: ld, Size: int64(len(tgz))}},
		Annotations: map[string]string{
			"org.opencontainers.image.title":   name,
			"org.opencontainers.image.version": version,
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return artifact{}, "", "", err
	}
	img, err := partial.CompressedToImage(chartImage{manifest: raw, config: config, layer: layer})
	if err != nil {
		return artifact{}, "", "", err
	}
	return artifact{image: img}, name, version, nil
}

// chartImage is the chart's manifest as go-containerregistry's image core, so that
// it is pushed the way images are.
type chartImage struct {
	manifest, config []byte
	layer            v1.Layer
}

func (c chartImage) RawConfigFile() ([]byte, error)      { return c.config, nil }
func (c chartImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (c chartImage) RawManifest() ([]byte, error)        { return c.manifest, nil }
func (c chartImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d, _ := c.layer.Digest(); d == h {
		return c.layer, nil
	}
	return nil, fmt.Errorf("chart artifact: no blob %s", h)
}
