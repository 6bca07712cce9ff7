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
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// builtAgent is the first build of TestAgentIndexBuiltTwiceHasTheSameDigest,
// which the tests after it inspect: the archive and SBOM Agent.Write wrote.
var builtAgent struct {
	*Agent
	archive, sbom string
}

// agentBuild returns the agent image built by the reproducibility test, building
// it here when that test did not run (go test -run).
func agentBuild(t *testing.T) (*Agent, string, string) {
	t.Helper()
	if builtAgent.Agent == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a first build for arm64 compiles every dependency
		defer cancel()
		dir := testTempDir(t)
		a, err := BuildAgent(ctx, repoRoot(t), filepath.Join(dir, "bin"), "istio-cni.local/install-cni:test", "")
		if err != nil {
			t.Fatal(err)
		}
		archive, sbom, err := a.Write(dir)
		if err != nil {
			t.Fatal(err)
		}
		builtAgent.Agent, builtAgent.archive, builtAgent.sbom = a, archive, sbom
	}
	return builtAgent.Agent, builtAgent.archive, builtAgent.sbom
}

// sharedDir holds what several tests of this package read (the agent build); it is
// removed when they end (TestMain).
var sharedDir string

func testTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp(sharedDir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestMain(m *testing.M) {
	var err error
	if sharedDir, err = os.MkdirTemp("", "istio-cni-image-test-"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(sharedDir)
	os.Exit(code)
}

// The agent image index built twice, from two separate builds of the binaries for
// both architectures in two different directories, has the same digest, the same
// archive bytes and the same SBOM bytes.
func TestAgentIndexBuiltTwiceHasTheSameDigest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a first build for arm64 compiles every dependency
	defer cancel()
	type build struct {
		digest        string
		archive, sbom [32]byte
		agent         *Agent
	}
	var builds []build
	for i := 0; i < 2; i++ {
		dir := testTempDir(t)
		a, err := BuildAgent(ctx, repoRoot(t), filepath.Join(dir, "bin"), "istio-cni.local/install-cni:test", "")
		if err != nil {
			t.Fatal(err)
		}
		d, err := a.Index.Digest()
		if err != nil {
			t.Fatal(err)
		}
		archive, sbom, err := a.Write(dir)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			builtAgent.Agent, builtAgent.archive, builtAgent.sbom = a, archive, sbom
		}
		ad, err := os.ReadFile(archive)
		if err != nil {
			t.Fatal(err)
		}
		sd, err := os.ReadFile(sbom)
		if err != nil {
			t.Fatal(err)
		}
		builds = append(builds, build{d.String(), sha256.Sum256(ad), sha256.Sum256(sd), a})
		t.Logf("build %d: index %s, archive %d bytes, sbom %d bytes", i+1, d, len(ad), len(sd))
	}
	if builds[0].digest != builds[1].digest {
		var differ []string
		for i, s := range builds[0].agent.Specs {
			for _, f := range s.Files {
				if f.Source == "" {
					continue
				}
				for _, g := range builds[1].agent.Specs[i].Files {
					if g.Path == f.Path {
						a, _ := os.ReadFile(f.Source)
						b, _ := os.ReadFile(g.Source)
						if !bytes.Equal(a, b) {
							differ = append(differ, s.Arch+":"+f.Path)
						}
					}
				}
			}
		}
		t.Errorf("two builds gave two digests: %s and %s; binaries that differ: %v (sources edited during the test?)", builds[0].digest, builds[1].digest, differ)
	}
	if builds[0].archive != builds[1].archive {
		t.Errorf("two builds gave different archive bytes")
	}
	if builds[0].sbom != builds[1].sbom {
		t.Errorf("two builds gave different SBOM bytes")
	}
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
	eachTarEntry(t, bytes.NewReader(layer), func(h *tar.Header, _ io.Reader) {
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: uid %d gid %d mtime %s", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		got = append(got, entry{h.Name, h.Linkname, h.Mode, h.Typeflag})
	})
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
	lp, _, m := unpackLayout(t, archive)
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

// checkEach fails t for every input of cases whose f(input) is not its wanted
// output; name is f's, for the message.
func checkEach[In, Out comparable](t *testing.T, name string, f func(In) Out, cases map[In]Out) {
	t.Helper()
	for in, want := range cases {
		if got := f(in); got != want {
			t.Errorf("%s(%#v) = %#v, want %#v", name, in, got, want)
		}
	}
}

func TestContainerdName(t *testing.T) {
	checkEach(t, "ContainerdName", ContainerdName, map[string]string{
		"istio-cni.local/install-cni:dev": "istio-cni.local/install-cni:dev",
		"localhost/x:1":                   "localhost/x:1",
		"reg:5000/x:1":                    "reg:5000/x:1",
		"istio/install-cni:1.0":           "docker.io/istio/install-cni:1.0",
		"busybox:1":                       "docker.io/library/busybox:1",
	})
}
