package repair

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// podNetns is a stand-in for a pod sandbox: a network namespace whose lo holds the
// pod's address, kept alive by a process inside it (the pause container) and/or a
// bind mount (what runtimes make under /var/run/netns).
type podNetns struct {
	bind  string // "" once unmounted
	inode uint64
	proc  *exec.Cmd
}

// newPodNetns makes the namespace in dir/name with ip on lo. withProcess keeps a
// sleep inside; keepBind=false unmounts it so only the process holds it. The
// namespace is made by unshare(1) in a child process, so that no thread of the test
// binary ever enters it: the finder under test reads every process's namespace.
func newPodNetns(t testing.TB, dir, name string, ip netip.Addr, withProcess, keepBind bool) *podNetns {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	pn := &podNetns{bind: path}
	t.Cleanup(func() {
		if pn.proc != nil {
			pn.proc.Process.Kill()
			pn.proc.Wait()
		}
		if pn.bind != "" {
			testns.Delete(pn.bind)
		}
	})
	if withProcess {
		pn.proc = exec.Command("unshare", "--net="+path, "sleep", "600")
		if err := pn.proc.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "namespace mounted", 5*time.Second, func() (bool, error) {
			var st unix.Statfs_t
			return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC, nil
		})
	} else if out, err := exec.Command("unshare", "--net="+path, "true").CombinedOutput(); err != nil {
		t.Fatalf("unshare: %v: %s", err, out)
	}
	var err error
	if pn.inode, err = netns.ID(path); err != nil {
		t.Fatal(err)
	}
	err = netns.Do(path, func() error { return sandbox.LoopbackAddr(ip) })
	if err != nil {
		t.Fatal(err)
	}
	if !keepBind {
		if err := testns.Delete(path); err != nil {
			t.Fatal(err)
		}
		pn.bind = ""
	}
	return pn
}

func TestProcFinderFindsNamespaceHeldOnlyByAProcess(t *testing.T) {
	root.Require(t)
	ip := netip.MustParseAddr("10.251.1.5")
	pn := newPodNetns(t, t.TempDir(), "pod", ip, true, false)
	f := &ProcFinder{ProcDir: "/proc"}
	ns, err := f.Find(context.Background(), []netip.Addr{netip.MustParseAddr("fd00::1"), ip})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if ns.Inode != pn.inode {
		t.Errorf("found namespace %d (%s), want %d", ns.Inode, ns.Source, pn.inode)
	}
	if want := filepath.Join("/proc", itoa(pn.proc.Process.Pid), "ns/net"); ns.Source != want {
		t.Errorf("source %s, want %s", ns.Source, want)
	}
	// The handle stays usable after the process is gone: it holds the namespace.
	pn.proc.Process.Kill()
	pn.proc.Wait()
	pn.proc = nil
	if got, err := netns.ID(ns.Path); err != nil || got != pn.inode {
		t.Errorf("held namespace after the process exited: %d, %v", got, err)
	}
}

func TestProcFinderFindsBindMountedNamespaceWithoutProcess(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	ip := netip.MustParseAddr("10.251.1.6")
	pn := newPodNetns(t, dir, "cni-1234", ip, false, true)
	// Without the directory there is nothing to find: no process is inside.
	if _, err := (&ProcFinder{ProcDir: "/proc"}).Find(context.Background(), []netip.Addr{ip}); !errors.Is(err, ErrNetnsNotFound) {
		t.Errorf("without the bind-mount directory: %v, want ErrNetnsNotFound", err)
	}
	ns, err := (&ProcFinder{ProcDir: "/proc", Dirs: []string{"/nonexistent", dir}}).Find(context.Background(), []netip.Addr{ip})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if ns.Inode != pn.inode || ns.Source != pn.bind {
		t.Errorf("found %d at %s, want %d at %s", ns.Inode, ns.Source, pn.inode, pn.bind)
	}
}

func TestProcFinderPrefersBindMountAndRefusesToGuessBetweenLiveNamespaces(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	ip := netip.MustParseAddr("10.251.1.7")
	pn := newPodNetns(t, dir, "both", ip, true, true)
	f := &ProcFinder{ProcDir: "/proc", Dirs: []string{dir}}
	ns, err := f.Find(context.Background(), []netip.Addr{ip})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Source != pn.bind {
		t.Errorf("source %s, want the bind mount %s", ns.Source, pn.bind)
	}
	ns.Close()

	// A second live namespace with the same address: which one is the pod's is
	// unknowable, so the finder says so instead of programming the wrong one.
	newPodNetns(t, dir, "twin", ip, true, false)
	if _, err := f.Find(context.Background(), []netip.Addr{ip}); err == nil {
		t.Error("two live namespaces hold the address, and Find picked one")
	}
}

func TestProcFinderReportsUnknownAddress(t *testing.T) {
	root.Require(t)
	_, err := (&ProcFinder{ProcDir: "/proc", Dirs: []string{"/var/run/netns"}}).Find(context.Background(), []netip.Addr{netip.MustParseAddr("10.251.254.254")})
	if !errors.Is(err, ErrNetnsNotFound) {
		t.Errorf("got %v, want ErrNetnsNotFound", err)
	}
	if _, err := (&ProcFinder{ProcDir: "/proc"}).Find(context.Background(), nil); err == nil {
		t.Error("a pod without addresses was looked for")
	}
}
