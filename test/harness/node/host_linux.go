package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostSysctls are the host settings kubelet (setupKernelTunables), ptp
// (forwarding) and Up (for dual-stack pods, see Options.PodCIDRv6) change; Down puts
// back what Up found.
var hostSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv6/conf/all/forwarding", // ptp, with dual-stack pods
	"net/core/devconf_inherit_init_net",
	"net/ipv6/conf/default/accept_dad",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// hostPaths are the places outside the state dir that containerd, libcni, kubelet
// and the mount(8) it runs create whatever their config says: containerd's shim
// sockets (/run/containerd/s), libcni's result cache, kubelet's container log
// symlinks, its device-plugin socket dir (/var/lib/kubelet/device-plugins, a
// compiled-in path), and libmount's /run/mount. Up records which existed; Down and
// Cleanup remove each one Up found absent, and never one that existed: then
// someone else owns it. test/node proves the list complete on a host without them.
var hostPaths = []string{"/var/lib/cni", "/run/containerd", "/var/log/containers", "/var/lib/kubelet", "/run/mount"}

// HostPaths lists the paths outside the state dir that a node may create (see
// hostPaths); Down and Cleanup remove the ones that did not exist before Up.
func HostPaths() []string { return slices.Clone(hostPaths) }

// kubeletChains are created by kubelet even with makeIPTablesUtilChains off (the
// hint chain tells other components which iptables backend is in use; the canary
// chains detect a flush).
var kubeletChains = []struct{ table, chain string }{
	{"mangle", "KUBE-IPTABLES-HINT"},
	{"mangle", "KUBE-KUBELET-CANARY"},
	{"nat", "KUBE-KUBELET-CANARY"},
	{"filter", "KUBE-KUBELET-CANARY"},
}

// kubeProxyTables are the nftables tables kube-proxy programs in nftables mode.
var kubeProxyTables = []struct{ family, name string }{{"ip", "kube-proxy"}, {"ip6", "kube-proxy"}}

func nftTableExists(family, name string) bool {
	return exec.Command("nft", "list", "table", family, name).Run() == nil
}

// hostBefore is what Up saw of the host before it touched anything.
// It is saved in the state dir so that Cleanup can undo a node whose process died.
type hostBefore struct {
	Sysctls map[string]string `json:"sysctls"`
	Existed map[string]bool   `json:"existed"`
	Chains  map[string]bool   `json:"chains"`  // "iptables/mangle/KUBE-IPTABLES-HINT" -> present
	Cgroups map[string]bool   `json:"cgroups"` // containerd's cgroup parents that existed
	// NftTables: kube-proxy's tables that existed ("ip kube-proxy" -> present).
	NftTables map[string]bool `json:"nftTables"`
}

func snapshotHost() *hostBefore {
	h := &hostBefore{Sysctls: map[string]string{}, Existed: map[string]bool{}, Chains: map[string]bool{}, Cgroups: map[string]bool{},
		NftTables: map[string]bool{}}
	for _, t := range kubeProxyTables {
		h.NftTables[t.family+" "+t.name] = nftTableExists(t.family, t.name)
	}
	for _, d := range containerdCgroupParents() {
		h.Cgroups[d] = true
	}
	for _, s := range hostSysctls {
		if v, err := os.ReadFile("/proc/sys/" + s); err == nil {
			h.Sysctls[s] = strings.TrimSpace(string(v))
		}
	}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		h.Existed[p] = err == nil
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, c := range kubeletChains {
			h.Chains[tool+"/"+c.table+"/"+c.chain] = chainExists(tool, c.table, c.chain)
		}
	}
	return h
}

func chainExists(tool, table, chain string) bool {
	return exec.Command(tool, "-w", "5", "-t", table, "-S", chain, "1").Run() == nil
}

// restore puts back the sysctls, deletes the iptables chains and host paths that
// appeared since the snapshot, and says what it undid.
func (h *hostBefore) restore() (undone []string, _ error) {
	var errs []error
	for s, v := range h.Sysctls {
		now, err := os.ReadFile("/proc/sys/" + s)
		if err == nil && strings.TrimSpace(string(now)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
			continue
		}
		undone = append(undone, fmt.Sprintf("sysctl %s %s->%s", s, strings.TrimSpace(string(now)), v))
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, c := range kubeletChains {
			if h.Chains[tool+"/"+c.table+"/"+c.chain] || !chainExists(tool, c.table, c.chain) {
				continue
			}
			for _, op := range []string{"-F", "-X"} {
				if out, err := exec.Command(tool, "-w", "5", "-t", c.table, op, c.chain).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s -t %s %s %s: %w: %s", tool, c.table, op, c.chain, err, bytes.TrimSpace(out)))
				}
			}
			undone = append(undone, fmt.Sprintf("%s chain %s/%s", tool, c.table, c.chain))
		}
	}
	for _, t := range kubeProxyTables {
		if h.NftTables[t.family+" "+t.name] || !nftTableExists(t.family, t.name) {
			continue
		}
		if out, err := exec.Command("nft", "delete", "table", t.family, t.name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nft delete table %s %s: %w: %s", t.family, t.name, err, bytes.TrimSpace(out)))
			continue
		}
		undone = append(undone, fmt.Sprintf("nftables table %s %s", t.family, t.name))
	}
	for _, d := range containerdCgroupParents() {
		if h.Cgroups[d] {
			continue
		}
		// Busy means another containerd on the machine uses it now: leave it.
		if err := syscall.Rmdir(d); err == nil {
			undone = append(undone, d)
		} else if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	for _, p := range hostPaths {
		if h.Existed[p] {
			continue
		}
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			continue
		}
		undone = append(undone, p)
	}
	return undone, errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// processesUsing lists the pids whose command line mentions dir: our servers, and
// containerd's shims, which name our socket.
func processesUsing(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if a := string(arg); a == dir || strings.HasPrefix(a, dir+"/") || strings.Contains(a, "="+dir+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// Leftovers lists what a node with this state dir and pod CIDR would have left on the
// host: processes naming the state dir, mounts under it, the dir itself, links with a
// pod-CIDR address (ptp's host-side veths), routes into the pod CIDR, and libcni
// cache entries of our network. Empty after a clean Down.
func Leftovers(stateDir string, podCIDR netip.Prefix) []string {
	var out []string
	for _, pid := range processesUsing(stateDir) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(bytes.TrimRight(cmd, "\x00")), "\x00", " ")))
	}
	if mps, err := mountsUnder(stateDir); err != nil {
		out = append(out, err.Error())
	} else {
		for _, mp := range mps {
			out = append(out, "mount "+mp)
		}
	}
	if _, err := os.Lstat(stateDir); err == nil {
		out = append(out, "directory "+stateDir)
	}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && podCIDR.Contains(ip) {
				name := strconv.Itoa(a.LinkIndex)
				if l, err := netlink.LinkByIndex(a.LinkIndex); err == nil {
					name = l.Attrs().Name
				}
				out = append(out, fmt.Sprintf("address %s on %s", ip, name))
			}
		}
	}
	if routes, err := netlink.RouteList(nil, netlink.FAMILY_V4); err == nil {
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			if ip, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && podCIDR.Contains(ip) {
				out = append(out, "route "+r.Dst.String())
			}
		}
	}
	if entries, err := os.ReadDir("/var/lib/cni/results"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), networkName+"-") {
				out = append(out, "libcni cache /var/lib/cni/results/"+e.Name())
			}
		}
	}
	return out
}
