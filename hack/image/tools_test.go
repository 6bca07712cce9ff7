package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// untarImage unpacks img's single layer into a new directory, as a runtime does.
func untarImage(t *testing.T, spec Spec) string {
	t.Helper()
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v (%d)", err, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	root := t.TempDir()
	untar(t, rc, root)
	return root
}

// untar unpacks a tar stream into dir: directories, regular files (with their
// mode) and symlinks, the only entries our images and archives hold.
func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	eachTarEntry(t, r, func(h *tar.Header, body io.Reader) {
		dst := filepath.Join(dir, h.Name)
		err := os.MkdirAll(filepath.Dir(dst), 0o755)
		if err == nil {
			switch h.Typeflag {
			case tar.TypeDir:
				err = os.MkdirAll(dst, 0o755)
			case tar.TypeSymlink:
				err = os.Symlink(h.Linkname, dst)
			case tar.TypeReg:
				var data bytes.Buffer
				if _, err = io.Copy(&data, body); err == nil {
					err = os.WriteFile(dst, data.Bytes(), os.FileMode(h.Mode))
				}
			default:
				t.Fatalf("%s: unexpected entry type %c", h.Name, h.Typeflag)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	})
}

// eachTarEntry calls fn with each entry of a tar stream and the entry's content.
func eachTarEntry(t *testing.T, r io.Reader, fn func(h *tar.Header, body io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

// The tools in the agent image run inside it, with nothing from the host: each
// flavour of iptables restores and saves rules that need the owner match and the
// REDIRECT target (modules loaded from the image's xtables directory), and nft
// lists them. They run chrooted into the unpacked image, in a fresh network
// namespace.
func TestAgentImageToolsRunInsideTheImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (chroot, network namespaces); run make test as root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Any file does for the binaries: only the tools are run.
	bins := map[string]string{"install-cni": self, "istio-cni": self, "istio-iptables": self, "istio-cni-doctor": self}
	spec, err := AgentSpec(context.Background(), "istio-cni.local/install-cni:tools", "amd64", "dev", bins)
	if err != nil {
		t.Fatal(err)
	}
	root := untarImage(t, spec)
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	ns, err := testns.New(t.TempDir(), "tools")
	if err != nil {
		t.Fatal(err)
	}
	defer testns.Delete(ns)

	run := func(stdin string, args ...string) string {
		t.Helper()
		// exec resolves a bare name in this process's PATH, outside the image.
		cmd := exec.Command("/usr/sbin/"+args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=" + AgentPath, "XTABLES_LOCKFILE=/tmp/xtables.lock"}
		cmd.Stdin = strings.NewReader(stdin)
		return testns.Run(t, ns, cmd)
	}
	rules := "*nat\n:OUT-TEST - [0:0]\n-A OUTPUT -p tcp -j OUT-TEST\n-A OUT-TEST -m owner --uid-owner 1337 -j RETURN\n-A OUT-TEST -p tcp -j REDIRECT --to-ports 15001\nCOMMIT\n"
	for _, flavour := range []string{"nft", "legacy"} {
		for _, fam := range []string{"iptables", "ip6tables"} {
			run(rules, fam+"-"+flavour+"-restore", "--noflush")
			saved := run("", fam+"-"+flavour+"-save", "-t", "nat")
			for _, want := range []string{"--uid-owner 1337", "REDIRECT --to-ports 15001"} {
				if !strings.Contains(saved, want) {
					t.Errorf("%s-%s-save in the image lacks %q:\n%s", fam, flavour, want, saved)
				}
			}
		}
	}
	if saved := run("", "iptables-save", "-t", "nat"); !strings.Contains(saved, "OUT-TEST") {
		t.Errorf("iptables (no suffix) in the image does not read the nft flavour's rules:\n%s", saved)
	}
	listed := run("", "nft", "list", "ruleset")
	if !strings.Contains(listed, "redirect to :15001") {
		t.Errorf("nft in the image does not list the iptables-nft rules:\n%s", listed)
	}
}

// qemuAarch64 returns qemu-aarch64-static from the locked qemu-user-static
// package, extracted once into the cache (keyed by the package's SHA-256).
func qemuAarch64(t *testing.T) string {
	t.Helper()
	lock, err := LoadDebianLock()
	if err != nil {
		t.Fatal(err)
	}
	var pkg LockedPackage
	for _, p := range lock.TestTools {
		if p.Name == "qemu-user-static" {
			pkg = p
		}
	}
	if pkg.Name == "" {
		t.Fatal("debian.lock has no qemu-user-static among its test tools")
	}
	bin := filepath.Join(CacheDir(), "qemu-"+pkg.SHA256, "qemu-aarch64-static")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	deb, err := FetchDeb(t.Context(), pkg)
	if err != nil {
		t.Fatal(err)
	}
	data, err := extractDebFile(deb, "/usr/bin/qemu-aarch64-static")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bin + ".tmp"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// The arm64 image's programs run on arm64, checked here under qemu's user-mode
// emulator (run directly with the unpacked image as its root for absolute paths,
// -L, so nothing is registered with the host kernel): the dynamic loader finds
// every library the iptables (both flavours) and nft tools need in the image,
// iptables loads its match and target modules (the owner match and the REDIRECT
// target, as the redirection uses), and the plugin starts. qemu does not pass
// netfilter netlink through (the nft flavour and nft stop at start-up there), so
// their libraries are checked with the loader's --list, and the rules themselves
// are programmed only by the amd64 test above.
func TestArm64ImageToolsRunUnderEmulation(t *testing.T) {
	qemu := qemuAarch64(t)
	a, _, _ := agentBuild(t)
	var spec Spec
	for _, s := range a.Specs {
		if s.Arch == "arm64" {
			spec = s
		}
	}
	root := untarImage(t, spec)
	const loader = "/lib/ld-linux-aarch64.so.1"
	for _, tc := range []struct {
		args []string
		env  string
		want []string
	}{
		{args: []string{"/usr/sbin/iptables-legacy", "-V"}, want: []string{"iptables v1.8.9 (legacy)"}},
		{args: []string{"/usr/sbin/ip6tables-legacy-save", "-V"}, want: []string{"ip6tables-save v1.8.9 (legacy)"}},
		{args: []string{"/usr/sbin/iptables-legacy", "-m", "owner", "-h"}, want: []string{"--uid-owner"}},
		{args: []string{"/usr/sbin/ip6tables-legacy", "-j", "REDIRECT", "-h"}, want: []string{"--to-ports"}},
		{args: []string{loader, "--list", "/usr/sbin/xtables-nft-multi"}, want: []string{"libnftnl.so.11 => /lib/aarch64-linux-gnu/libnftnl.so.11", "libxtables.so.12 =>", "libc.so.6 =>"}},
		{args: []string{loader, "--list", "/usr/sbin/nft"}, want: []string{"libnftables.so.1 =>", "libedit.so.2 =>", "libjansson.so.4 =>", "libgmp.so.10 =>"}},
		{args: []string{"/opt/cni/bin/istio-cni"}, env: "CNI_COMMAND=VERSION", want: []string{`"supportedVersions"`}},
	} {
		cmd := exec.Command(qemu, append([]string{"-L", root, filepath.Join(root, tc.args[0])}, tc.args[1:]...)...)
		cmd.Env = []string{"PATH=" + AgentPath}
		if tc.env != "" {
			cmd.Env = append(cmd.Env, tc.env)
		}
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Contains(string(out), "not found") {
			t.Errorf("arm64 %s: %v:\n%s", strings.Join(tc.args, " "), err, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("arm64 %s: no %q in:\n%s", strings.Join(tc.args, " "), w, out)
			}
		}
	}
}
