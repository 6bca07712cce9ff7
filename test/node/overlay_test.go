package node

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/node"
)

// overlayRoots are the host trees the node's components could write outside its
// state dir. The state dir itself must be outside them: containerd's overlayfs
// snapshots cannot have an overlayfs upper dir.
var overlayRoots = []string{"/etc", "/opt", "/run", "/var/lib", "/var/log"}

// hostOverlay is a private mount namespace, held by a sleeping process, in which
// each of overlayRoots is an overlay: the machine's directory below, an empty
// directory of the test's above. The paths node.HostPaths lists are whited out in
// the upper layer, so whatever runs in the namespace sees a host that never had
// them, whatever this machine has; and everything it creates, changes or deletes
// under the roots lands in the upper layer, which changes reads afterwards. The
// machine's own files are never written.
type hostOverlay struct {
	t         *testing.T
	dir       string
	holder    *exec.Cmd
	whiteouts map[string]bool // host paths whited out before the run
}

func newHostOverlay(t *testing.T, hidden []string) *hostOverlay {
	t.Helper()
	o := &hostOverlay{t: t, dir: t.TempDir(), whiteouts: map[string]bool{}}
	var script strings.Builder
	script.WriteString("set -e\n")
	for i, root := range overlayRoots {
		upper, work := o.upper(root), filepath.Join(o.dir, strconv.Itoa(i), "work")
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&script, "mount -n -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s\n", root, upper, work, root)
	}
	for _, p := range hidden {
		root := rootOf(p)
		if root == "" || filepath.Dir(p) != root {
			t.Fatalf("host path %s is not directly under one of %v: extend overlayRoots", p, overlayRoots)
		}
		if err := unix.Mknod(filepath.Join(o.upper(root), filepath.Base(p)), unix.S_IFCHR, 0); err != nil {
			t.Fatalf("whiteout %s: %v", p, err)
		}
		o.whiteouts[p] = true
	}
	script.WriteString("echo ready\nexec sleep 3600\n")
	o.holder = exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script.String())
	o.holder.Stderr = testWriter{t}
	out, err := o.holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.holder.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	t.Cleanup(func() {
		o.holder.Process.Kill()
		o.holder.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("mount namespace with overlays did not come up: %q %v", line, err)
	}
	return o
}

func (o *hostOverlay) upper(root string) string {
	return filepath.Join(o.dir, strconv.Itoa(slices.Index(overlayRoots, root)), "upper")
}

func rootOf(p string) string {
	for _, r := range overlayRoots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return r
		}
	}
	return ""
}

// command runs name inside the namespace, in the repository root (the node
// command finds hack/ from there).
func (o *hostOverlay) command(name string, args ...string) *exec.Cmd {
	root, err := filepath.Abs("../..")
	if err != nil {
		o.t.Fatal(err)
	}
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(o.holder.Process.Pid), "-m", "--", "env", "--chdir=" + root, name}, args...)...)
}

// changes lists what the run left under the roots: a path in the upper layer that
// the machine's directory lacks (created and left), a file in the upper layer
// (created, or a machine's file changed), or a whiteout the test did not place (a
// machine's path deleted). A directory that exists below and holds no change is a
// copy-up of a parent, not a change.
func (o *hostOverlay) changes() []string {
	var out []string
	for _, root := range overlayRoots {
		upper := o.upper(root)
		err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == upper {
				return err
			}
			host := filepath.Join(root, strings.TrimPrefix(p, upper+"/"))
			info, err := d.Info()
			if err != nil {
				return err
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
				if !o.whiteouts[host] {
					out = append(out, "deleted: "+host)
				}
				return nil
			}
			below, err := os.Lstat(host) // the machine's, seen from the host's namespace
			switch {
			case err != nil || o.whiteouts[host]:
				kind := "file"
				if d.IsDir() {
					kind = "directory"
				}
				out = append(out, fmt.Sprintf("left behind: %s (%s)", host, kind))
				if d.IsDir() {
					return fs.SkipDir
				}
			case !d.IsDir() || !below.IsDir():
				out = append(out, "changed: "+host)
			}
			return nil
		})
		if err != nil { // an unread upper layer must not pass as an unchanged host
			out = append(out, fmt.Sprintf("cannot read the overlay of %s: %v", root, err))
		}
	}
	return out
}

// A node brought up as hack/node/up.sh does, on a host that has none of the paths
// the node's components create outside its state dir, then taken down (SIGTERM:
// Down) or killed (SIGKILL: no Down, then Cleanup as hack/node/down.sh does), leaves
// the host exactly as it was: nothing created, changed or deleted under /etc, /opt,
// /run, /var/lib and /var/log, and the sysctls, cgroups and chains as before.
func TestNodeCommandLeavesAHostWithoutItsPathsAsItWas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (mount namespaces, containerd, kubelet); run it with sudo")
	}
	bin := filepath.Join(t.TempDir(), "node")
	if out, err := exec.Command("go", "build", "-o", bin, "../harness/node/cmd/node").CombinedOutput(); err != nil {
		t.Fatalf("build node command: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, o *hostOverlay, cmd *exec.Cmd, state string)
	}{
		{"down", func(t *testing.T, o *hostOverlay, cmd *exec.Cmd, state string) {
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := waitBounded(cmd, downBound); err != nil {
				t.Errorf("node command after SIGTERM: %v", err)
			}
		}},
		{"killed then cleanup", func(t *testing.T, o *hostOverlay, cmd *exec.Cmd, state string) {
			// Killing the command kills its children (Pdeathsig) but not
			// containerd's shims nor the containers.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if left := processesNaming(state); len(left) == 0 {
				t.Fatal("a killed node left no process behind: this case would prove nothing")
			}
			cleanup := o.command(bin, "-cleanup", "-state", state, "-pod-cidr", testPodCIDR.String())
			cleanup.Stdout, cleanup.Stderr = testWriter{t}, testWriter{t}
			began := time.Now()
			if err := cleanup.Run(); err != nil {
				t.Errorf("node -cleanup: %v", err)
			}
			t.Logf("cleanup after a killed node: %s", time.Since(began).Round(time.Millisecond))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := hostView(t)
			o := newHostOverlay(t, hostPathsOfNode())
			state, err := os.MkdirTemp("/var/tmp", "istio-cni-node-overlay-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(state) })
			cmd := o.command(bin, "-state", state, "-pod-cidr", testPodCIDR.String(), "-name", "overlay-node")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = testWriter{t}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
				if _, err := os.Stat(state); err == nil { // the case failed before its own clean-up
					c := o.command(bin, "-cleanup", "-state", state, "-pod-cidr", testPodCIDR.String())
					c.Stdout, c.Stderr = io.Discard, testWriter{t}
					c.Run()
				}
			})
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "export KUBECONFIG=") {
				t.Fatalf("node command did not come up: %q %v", line, err)
			}
			cs := controlplane.KubeconfigClientForTest(t, strings.TrimSpace(strings.TrimPrefix(line, "export KUBECONFIG=")))
			// A pod whose sandbox uses the pause image only: no extra image to import.
			pod, _ := runPodImage(t.Context(), t, cs, "p", pauseImage)
			if pod == nil {
				t.FailNow()
			}
			ip := checkPodIP(t, pod)
			if !hasRoute(t, ip) {
				t.Errorf("no host route to the pod %s", ip)
			}
			during := o.changes()
			t.Logf("outside its state dir, with a pod running, the node has made: %s", strings.Join(during, "; "))
			if len(during) == 0 {
				t.Error("with a pod running, the node has created nothing outside its state dir: the overlay sees nothing, so this test would prove nothing")
			}

			tc.stop(t, o, cmd, state)

			if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("state dir %s still there: %v", state, err)
			}
			if left := processesNaming(state); len(left) > 0 {
				t.Errorf("processes left: %v", left)
			}
			if hasRoute(t, ip) {
				t.Errorf("route to the pod %s still there", ip)
			}
			for _, c := range o.changes() {
				t.Errorf("host changed: %s", c)
			}
			checkHostAsBefore(t, before)
		})
	}
}

func waitBounded(cmd *exec.Cmd, bound time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(bound):
		cmd.Process.Kill()
		return fmt.Errorf("still running after %s; killed", bound)
	}
}

func hostPathsOfNode() []string { return node.HostPaths() }

const pauseImage = node.PauseImage

// processesNaming lists the processes whose command line names the state dir.
func processesNaming(state string) []string {
	var out []string
	for _, l := range node.Leftovers(state, netip.Prefix{}) {
		if strings.HasPrefix(l, "process ") {
			out = append(out, l)
		}
	}
	return out
}
