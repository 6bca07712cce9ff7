package image

import (
	"context"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A build version reaches the binaries (their --version) and the image's label,
// and two versions of the same sources are two images: a pushed release is never
// the same image as a dev build, so a node that holds both keeps them apart.
func TestBuildVersionIsInTheBinariesAndTheImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := testTempDir(t)
	bins, err := GoBuild(ctx, repoRoot(t), dir, runtime.GOARCH, "1.2.3-rc.1", "./cmd/install-cni", "./cmd/istio-iptables", "./cmd/istio-cni")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"install-cni", "istio-iptables"} {
		out, err := exec.CommandContext(ctx, bins[name], "--version").CombinedOutput()
		if got, want := strings.TrimSpace(string(out)), name+" 1.2.3-rc.1"; err != nil || got != want {
			t.Errorf("%s --version: %q (err %v), want %q", name, got, err, want)
		}
	}
	// The plugin, run without CNI_COMMAND as a person would, says what it is (the
	// CNI library's "about" line).
	out, _ := exec.CommandContext(ctx, bins["istio-cni"]).CombinedOutput()
	if !strings.Contains(string(out), "istio-cni 1.2.3-rc.1") {
		t.Errorf("istio-cni without CNI_COMMAND says %q, want it to name istio-cni 1.2.3-rc.1", out)
	}

	spec := func(ver string) Spec {
		return Spec{Ref: "istio-cni.local/install-cni:v", Arch: runtime.GOARCH, Labels: map[string]string{VersionLabel: ver},
			Files: []File{{Path: "/usr/local/bin/install-cni", Source: bins["install-cni"]}}}
	}
	digests := map[string]string{}
	for _, ver := range []string{"1.0.0", "1.0.1"} {
		img, err := Build(spec(ver))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Config.Labels[VersionLabel]; got != ver {
			t.Errorf("label %s = %q, want %q", VersionLabel, got, ver)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests[ver] = d.String()
	}
	if digests["1.0.0"] == digests["1.0.1"] {
		t.Errorf("versions 1.0.0 and 1.0.1 of the same files have one digest %s", digests["1.0.0"])
	}
}

func TestCheckVersionRefusesWhatIsNotATag(t *testing.T) {
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{"dev", true},
		{"1.0.0", true},
		{"v1.29.1-distroless_2", true},
		{strings.Repeat("a", 128), true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{"-rc", false},
		{".1", false},
		{"1.0 0", false},         // a space would split -ldflags
		{"1.0.0+build.1", false}, // + is not a tag character
		{"a/b", false},
		{"x=y", false},
	} {
		err := CheckVersion(tc.v)
		if (err == nil) != tc.ok {
			t.Errorf("CheckVersion(%q) = %v, want ok=%v", tc.v, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "build version") {
			t.Errorf("CheckVersion(%q): %v does not name the build version", tc.v, err)
		}
	}
}
