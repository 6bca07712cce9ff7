package iptables

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestLegacyIptablesBefore186WaitsOnlyForItsNamespacesLock: legacy
// iptables-restore before 1.8.6 (Amazon Linux 2's 1.8.4, Ubuntu 20.04's with
// IPTABLES_MODE=legacy) does not read XTABLES_LOCKFILE: with --wait it blocks on
// its build's lock, the node's /run/xtables.lock, which kube-proxy and every
// other iptables user on the node hold while they write the node's rules. A
// pod's ADD must take its namespace's own lock instead, as with later releases
// (and as Istio's plugin does for them, by a bind mount in a mount namespace of
// the tool's own), and not wait for the node's writers. The tool here is such a
// release: a wrapper that answers --version as 1.8.4 and locks the build's lock
// (a file of the test's in place of /run/xtables.lock) before it restores. The
// same for a pod with hostUsers: false, whose tools run in the pod's user
// namespace and still open the namespace's lock, mounted in the mount namespace
// the restore runs in.
func TestLegacyIptablesBefore186WaitsOnlyForItsNamespacesLock(t *testing.T) {
	root.Require(t)
	nodeLock := fakeLegacy184(t)
	// Another iptables user on the node holds the node's lock meanwhile.
	holdLock(t, nodeLock)
	for _, pod := range []struct {
		name  string
		netns func(t *testing.T) string
	}{
		{"a pod of the node's user namespace", newNS},
		{"a pod with hostUsers: false", func(t *testing.T) string { return testns.NewInUserNamespace(t) }},
	} {
		t.Run(pod.name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := NewBackend(Config{Mode: ModeLegacy, LockDir: dir, NativeStateDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			b.nodeLock = nodeLock
			ns := pod.netns(t)
			plan := specs.Sidecar().Plan(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			if _, err := capture.Apply(ctx, ns, b, plan); err != nil {
				t.Fatalf("the pod's rules waited for the node's xtables lock (%v): %v", time.Since(start).Round(time.Millisecond), err)
			}
			if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
				t.Fatalf("verify after apply: %v %q", err, diffs)
			}
			if got := runIn(t, ns, "iptables-legacy-save"); !strings.Contains(got, "-j ISTIO_OUTPUT") {
				t.Errorf("the pod's rules are not in place:\n%s", got)
			}
		})
	}
}

// TestLegacyNodeLockIsMaskedOnlyBefore186: the mount is for releases that do not
// read XTABLES_LOCKFILE (or whose version cannot be read); later ones take the
// namespace's lock by the variable alone, and their restores run as before.
func TestLegacyNodeLockIsMaskedOnlyBefore186(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"v1.8.4 (legacy)", true},
		{"v1.8.5 (legacy)", true},
		{"v1.8.6 (legacy)", false},
		{"v1.8.9 (legacy)", false},
		{"v1.8.9 (nf_tables)", true},
		{"garbage", true},
	} {
		for _, name := range []string{"iptables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy-restore", "ip6tables-legacy-save"} {
			script := "#!/bin/sh\necho '" + name + " " + tc.version + "'\n"
			if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		dir := t.TempDir()
		b, err := NewBackend(Config{Mode: ModeLegacy, LockDir: dir, NativeStateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.masksNodeLock(); got != tc.want {
			t.Errorf("iptables-legacy-restore %s: node lock masked %v, want %v", tc.version, got, tc.want)
		}
	}
}

// fakeLegacy184 puts first in PATH an iptables-legacy-restore that stands in for a
// release before 1.8.6: it answers --version as 1.8.4 and locks its build's lock
// (nodeLock, a file of the test's in place of /run/xtables.lock) before it
// restores, whatever XTABLES_LOCKFILE says.
func fakeLegacy184(t *testing.T) (nodeLock string) {
	t.Helper()
	real, err := exec.LookPath("iptables-legacy-restore")
	if err != nil {
		t.Fatalf("iptables-legacy-restore not installed: %v", err)
	}
	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("flock not installed: %v", err)
	}
	nodeLock = filepath.Join(t.TempDir(), "xtables.lock")
	bin := t.TempDir()
	script := "#!/bin/sh\n" +
		"case \"$1\" in --version|-V) echo 'iptables-restore v1.8.4 (legacy)'; exit 0;; esac\n" +
		"exec 9>>" + nodeLock + " || exit 4\n" +
		"flock 9 || exit 4\n" +
		// The real restore under it takes a lock no one else takes: the one above is
		// the only lock of a release before 1.8.6.
		"XTABLES_LOCKFILE=" + filepath.Join(bin, "inner.lock") + " exec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "iptables-legacy-restore"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return nodeLock
}

// holdLock takes the lock at path, as another iptables user on the node does,
// until the test ends.
func holdLock(t *testing.T, path string) {
	t.Helper()
	held, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}
