package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// The agent image built twice, from two separate builds of the binaries in two
// different directories, has the same digest and the same archive bytes.
func TestAgentImageBuiltTwiceHasTheSameDigest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var digests []string
	var archives [][32]byte
	var builds []map[string]string
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		bins, err := GoBuild(ctx, repoRoot(t), filepath.Join(dir, "bin"), AgentBinaries...)
		if err != nil {
			t.Fatal(err)
		}
		builds = append(builds, bins)
		spec, err := AgentSpec("istio-cni.local/install-cni:test", bins)
		if err != nil {
			t.Fatal(err)
		}
		img, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
		archive := filepath.Join(dir, "image.tar")
		if err := WriteArchive(archive, spec.Ref, img); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(archive)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, sha256.Sum256(data))
	}
	if digests[0] != digests[1] {
		var differ []string
		for name, path := range builds[0] {
			a, _ := os.ReadFile(path)
			b, _ := os.ReadFile(builds[1][name])
			if !bytes.Equal(a, b) {
				differ = append(differ, name)
			}
		}
		t.Errorf("two builds gave two digests: %s and %s; binaries that differ: %v (sources edited during the test?)", digests[0], digests[1], differ)
	}
	if archives[0] != archives[1] {
		t.Errorf("two builds gave different archive bytes")
	}
	t.Logf("agent image digest %s", digests[0])
}

// The layer holds exactly the listed entries, sorted, parents first, root-owned and
// dated at the epoch, executables 0755, whatever order the spec lists them in.
func TestLayerIsSortedRootOwnedAndDatedAtTheEpoch(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "exe")
	data := filepath.Join(dir, "data")
	os.WriteFile(exe, []byte("#!"), 0o700)
	os.WriteFile(data, []byte("x"), 0o600)
	layer, err := layerTarball([]File{
		{Path: "/usr/local/bin/b", Source: exe},
		{Path: "/etc/a", Source: data},
		{Path: "/usr/local/bin/a", Link: "/opt/x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Name, Link string
		Mode       int64
		Type       byte
	}
	var got []entry
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: uid %d gid %d mtime %s", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		got = append(got, entry{h.Name, h.Linkname, h.Mode, h.Typeflag})
	}
	want := []entry{
		{"etc/", "", 0o755, tar.TypeDir},
		{"etc/a", "", 0o644, tar.TypeReg},
		{"usr/", "", 0o755, tar.TypeDir},
		{"usr/local/", "", 0o755, tar.TypeDir},
		{"usr/local/bin/", "", 0o755, tar.TypeDir},
		{"usr/local/bin/a", "/opt/x", 0o777, tar.TypeSymlink},
		{"usr/local/bin/b", "", 0o755, tar.TypeReg},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

// The archive is a valid OCI image layout whose image has the digest of the built one.
func TestArchiveIsAnOCILayoutOfTheImage(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	os.WriteFile(src, []byte("hello"), 0o755)
	img, err := Build(Spec{Ref: "istio-cni.local/x:v1", Files: []File{{Path: "/f", Source: src}}, Entrypoint: []string{"/f"}})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "x.tar")
	if err := WriteArchive(archive, "istio-cni.local/x:v1", img); err != nil {
		t.Fatal(err)
	}
	unpacked := filepath.Join(dir, "layout")
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	untar(t, f, unpacked)
	lp, err := layout.FromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != want {
		t.Fatalf("index manifests %+v, want one with digest %s", m.Manifests, want)
	}
	if got := m.Manifests[0].Annotations["io.containerd.image.name"]; got != "istio-cni.local/x:v1" {
		t.Errorf("containerd name %q", got)
	}
	loaded, err := lp.Image(want)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loaded.Layers(); err != nil {
		t.Fatal(err)
	}
}

func TestContainerdName(t *testing.T) {
	for in, want := range map[string]string{
		"istio-cni.local/install-cni:dev": "istio-cni.local/install-cni:dev",
		"localhost/x:1":                   "localhost/x:1",
		"reg:5000/x:1":                    "reg:5000/x:1",
		"istio/install-cni:1.0":           "docker.io/istio/install-cni:1.0",
		"busybox:1":                       "docker.io/library/busybox:1",
	} {
		if got := ContainerdName(in); got != want {
			t.Errorf("ContainerdName(%q) = %q, want %q", in, got, want)
		}
	}
}
