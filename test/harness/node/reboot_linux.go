package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// shimSocketDir is where containerd's shims put their sockets whatever containerd's
// config says (a tmpfs, /run, on a real node).
const shimSocketDir = "/run/containerd/s"

// Reboot does to the node what a reboot does, with the control plane (which on a
// real cluster runs elsewhere) left up: kubelet, kube-proxy and containerd stop,
// every container and shim is killed, and what lives on tmpfs on a real node is
// gone: containerd's state dir and runc root (/run/containerd), the pods' network
// namespaces and every other mount under the state dir (projected token volumes,
// sandboxes' /dev/shm, container root filesystems), the shims' sockets, kube-proxy's
// nftables tables (a booting kernel has no rules), and the directories in volatile,
// removed entirely (those of the workloads' hostPaths under /run, such as an agent's
// /var/run/istio-cni; the kubelet makes a DirectoryOrCreate one again). What is on
// disk stays: containerd's root (images, and the metadata of every sandbox and
// container, which containerd reports as not ready after its restart), kubelet's
// root dir, the CNI conf and bin dirs, host-local's IP allocations and libcni's
// cache. Then containerd, kubelet and kube-proxy start again and Reboot returns once
// the node is Ready, as Up does: the kubelet re-creates every pod of the node in a
// new sandbox (so each one gets a new CNI ADD) in whatever order its workers pick.
//
// Sysctls and the host iptables chains kubelet makes are left as they are: they
// belong to this machine's real boot, not the node's.
func (n *Node) Reboot(ctx context.Context, volatile ...string) error {
	began := time.Now()
	for _, d := range volatile {
		d = filepath.Clean(d)
		if !strings.HasPrefix(d, n.l.state+"/") {
			return fmt.Errorf("node: reboot: %s is not under the state dir %s: only the node's own files may go", d, n.l.state)
		}
	}
	var errs errList
	errs.add(n.kubelet.Stop(10 * time.Second))
	errs.add(n.kubeProxy.Stop(5 * time.Second))
	errs.add(n.containerd.Stop(10 * time.Second))
	if len(errs) > 0 {
		return fmt.Errorf("node: reboot: %w", errors.Join(errs...))
	}
	// The shims outlive containerd, as they do under systemd until the machine goes.
	shims := processesUsing(n.l.path("containerd"))
	sockets := shimSockets(shims)
	errs.add(killContainers(n.l.runcRoot()))
	killAll(shims)
	waitGone(shims, 10*time.Second)
	mounts, err := mountsUnder(n.l.state)
	errs.add(err)
	for _, mp := range mounts {
		if mp == n.l.state { // the disk the node's files are on, if it is a mount
			continue
		}
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			errs.add(fmt.Errorf("node: reboot: unmount %s: %w", mp, err))
		}
	}
	for _, s := range sockets {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs.add(fmt.Errorf("node: reboot: remove shim socket: %w", err))
		}
	}
	for _, d := range append([]string{n.l.containerdState(), n.l.runcRoot()}, volatile...) {
		if err := os.RemoveAll(d); err != nil {
			errs.add(fmt.Errorf("node: reboot: remove %s: %w", d, err))
		}
	}
	for _, t := range kubeProxyTables {
		if !nftTableExists(t.family, t.name) {
			continue
		}
		if out, err := exec.Command("nft", "delete", "table", t.family, t.name).CombinedOutput(); err != nil {
			errs.add(fmt.Errorf("node: reboot: nft delete table %s %s: %w: %s", t.family, t.name, err, bytes.TrimSpace(out)))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("node: reboot: %w", errors.Join(errs...))
	}
	n.step("reboot: %d containers' shims killed, %d mounts and %d shim sockets gone, %d volatile dirs removed (%s)",
		len(shims), len(mounts), len(sockets), len(volatile), since(began))

	t := time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return fmt.Errorf("node: reboot: %w", err)
	}
	// Its socket answers before its CRI service has loaded what the metadata
	// holds, and a kubelet started then exits at once (systemd would restart it).
	if err := poll(ctx, n.containerd, "containerd's CRI service", func() (bool, string) {
		conds, err := n.RuntimeStatus(ctx)
		if err != nil {
			return false, err.Error()
		}
		return conds["RuntimeReady"].Status, fmt.Sprint(conds)
	}); err != nil {
		return fmt.Errorf("node: reboot: %w", err)
	}
	kubeletStart := time.Now()
	if err := n.startKubelet(ctx, n.kubeBin, n.kubeletCAFile); err != nil {
		return fmt.Errorf("node: reboot: %w", err)
	}
	if err := n.startKubeProxy(n.kubeBin); err != nil {
		return fmt.Errorf("node: reboot: %w", err)
	}
	if err := n.waitReady(ctx, kubeletStart); err != nil {
		return fmt.Errorf("node: reboot: %w", err)
	}
	n.step("reboot: node %s Ready again (%s after the restart, %s in all)", n.opts.NodeName, since(t), since(began))
	return nil
}

// shimSockets are the paths of the unix sockets in shimSocketDir that the
// processes hold open: a shim removes its own only when containerd shuts it down,
// never when it is killed.
func shimSockets(pids []int) []string {
	inodes := map[string]bool{}
	for _, pid := range pids {
		fdDir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, _ := os.ReadDir(fdDir)
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if ino, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	// "Num RefCount Protocol Flags Type St Inode Path", one line per socket of
	// this network namespace (the shims run in the host's).
	data, _ := os.ReadFile("/proc/net/unix")
	seen := map[string]bool{}
	var paths []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !inodes[f[6]] || !strings.HasPrefix(f[7], shimSocketDir+"/") || seen[f[7]] {
			continue
		}
		seen[f[7]] = true
		paths = append(paths, f[7])
	}
	return paths
}

// waitGone waits (up to max) until the processes have exited.
func waitGone(pids []int, max time.Duration) {
	deadline := time.Now().Add(max)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}
