package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/istio-cni/istio-cni/hack/image"
)

func TestRepositoryName(t *testing.T) {
	for in, want := range map[string]string{
		"istio-cni.local/install-cni:dev":               "install-cni",
		"registry.example.com:5000/mesh/install-cni":    "install-cni",
		"install-cni@sha256:" + strings.Repeat("a", 64): "install-cni",
		"not an image name":                             "",
		"localhost:5000/proxy-standin:dev":              "proxy-standin",
	} {
		if got := repositoryName(in); got != want {
			t.Errorf("repositoryName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFindArchivePicksTheAgentImage: among what make image writes, the archive or
// layout holding the install-cni image, by the name inside it, else by its file name.
func TestFindArchivePicksTheAgentImage(t *testing.T) {
	img, err := image.Build(image.Spec{Ref: "istio-cni.local/x:dev", Files: []image.File{{Path: "/x", Link: "/y"}}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(dir, file, ref string) {
		if err := image.WriteArchive(filepath.Join(dir, file), ref, img); err != nil {
			t.Fatal(err)
		}
	}
	both := t.TempDir()
	write(both, "install-cni_dev.oci.tar", "istio-cni.local/install-cni:dev")
	write(both, "proxy-standin_dev.oci.tar", "istio-cni.local/proxy-standin:dev")
	os.WriteFile(filepath.Join(both, "notes.txt"), []byte("not an image"), 0o644)
	standinOnly := t.TempDir()
	write(standinOnly, "proxy-standin_dev.oci.tar", "istio-cni.local/proxy-standin:dev")
	renamed := t.TempDir()
	write(renamed, "agent.tar", "registry.example.com/mesh/install-cni:1.0")
	unnamed := t.TempDir()
	if _, err := layout.Write(filepath.Join(unnamed, "install-cni"), empty.Index); err != nil {
		t.Fatal(err)
	}
	two := t.TempDir()
	write(two, "a.tar", "istio-cni.local/install-cni:dev")
	write(two, "b.tar", "istio-cni.local/install-cni:other")

	for _, tc := range []struct {
		name, dir, want, wantErr string
	}{
		{"make image's two archives", both, "install-cni_dev.oci.tar", ""},
		{"by the name inside, not the file's", renamed, "agent.tar", ""},
		{"a layout directory naming nothing, by its file name", unnamed, "install-cni", ""},
		{"no agent image", standinOnly, "", "names a install-cni image (run make image first); found: proxy-standin_dev.oci.tar (istio-cni.local/proxy-standin:dev, dev)"},
		{"two agent images", two, "", "2 OCI archives"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findArchive(tc.dir, "install-cni")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("findArchive = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != filepath.Join(tc.dir, tc.want) {
				t.Fatalf("findArchive = %q, %v; want %s", got, err, tc.want)
			}
		})
	}
}
