package repair

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
)

// Netns is a pod's network namespace, held open so it cannot disappear or be
// replaced while the capture is programmed. Close it when done.
type Netns struct {
	// Path enters the namespace (the held file, through /proc/self/fd).
	Path string
	// Source is where it was found, for people: /proc/PID/ns/net or a bind mount.
	Source string
	// Inode identifies the namespace.
	Inode uint64
	// Proc is the /proc directory of the oldest process in it (the sandbox's pause
	// process), through the finder's ProcDir; "" when no process holds it. A pod with
	// hostUsers: false has its user namespace's id maps read there.
	Proc string
	// PodUID is the pod uid that the cgroup of the process at Proc names (the
	// kubelet's pod cgroup: PodUIDFromCgroup); "" when it names none or there is no
	// process. CheckSandboxOf compares it with the pod's.
	PodUID string
	file   *os.File
}

// Close releases the namespace.
func (n *Netns) Close() error { return n.file.Close() }

// NetnsFinder finds the network namespace of a running pod on this node from its
// addresses.
type NetnsFinder interface {
	Find(ctx context.Context, ips []netip.Addr) (*Netns, error)
}

// ErrNetnsNotFound means no namespace on the node holds the pod's addresses.
var ErrNetnsNotFound = errors.New("no network namespace on this node holds the pod's address")

// ProcFinder searches the namespaces of the node's processes (ProcDir/PID/ns/net)
// and the bind-mounted namespaces in Dirs, entering each distinct namespace once
// and looking for an interface that holds one of the pod's addresses. The runtime
// keeps the pod sandbox (pause) process in the namespace, so it is found even when
// the runtime bind-mounts namespaces somewhere not listed in Dirs, as Istio relies
// on; Dirs also finds namespaces that no process holds.
type ProcFinder struct {
	ProcDir string
	Dirs    []string
}

type nsCandidate struct {
	inode   uint64
	path    string // where to open it
	bind    bool   // a bind mount rather than a process's
	pids    int    // processes inside
	started uint64 // start time of the oldest process, clock ticks after boot
	proc    string // the oldest process's /proc directory
}

// Find returns the one namespace holding any of ips. Namespaces with processes are
// preferred over bind mounts nobody uses (a sandbox being torn down); more than one
// live namespace holding the address is an error rather than a guess.
func (f *ProcFinder) Find(ctx context.Context, ips []netip.Addr) (*Netns, error) {
	if len(ips) == 0 {
		return nil, errors.New("find network namespace: the pod has no IP address in its status yet")
	}
	cands, err := f.candidates()
	if err != nil {
		return nil, err
	}
	var found []*Netns
	var live []bool
	var skipped int
	var firstSkip error
	defer func() {
		for _, n := range found {
			n.file.Close()
		}
	}()
	for _, c := range cands {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("find network namespace: %w", err)
		}
		n, ok, err := holds(c, ips)
		if err != nil {
			// Processes come and go while we look; a vanished one is not an error.
			skipped++
			if firstSkip == nil {
				firstSkip = err
			}
			continue
		}
		if !ok {
			continue
		}
		found = append(found, n)
		live = append(live, c.pids > 0)
	}
	if len(found) == 0 {
		err := fmt.Errorf("%w (looked for %s in %d namespaces of %s and %s)", ErrNetnsNotFound,
			joinAddrs(ips), len(cands), f.ProcDir, strings.Join(f.Dirs, ", "))
		if skipped > 0 {
			err = fmt.Errorf("%w; %d could not be read, the first: %w", err, skipped, firstSkip)
		}
		return nil, err
	}
	pick := -1
	if len(found) == 1 {
		pick = 0
	} else {
		var liveIdx []int
		for i, l := range live {
			if l {
				liveIdx = append(liveIdx, i)
			}
		}
		if len(liveIdx) == 1 {
			pick = liveIdx[0]
		}
	}
	if pick < 0 {
		var srcs []string
		for _, n := range found {
			srcs = append(srcs, n.Source)
		}
		return nil, fmt.Errorf("find network namespace: %d namespaces hold %s (%s); refusing to guess",
			len(found), joinAddrs(ips), strings.Join(srcs, ", "))
	}
	n := found[pick]
	found = slices.Delete(found, pick, pick+1)
	if n.Proc != "" {
		// A process gone meanwhile leaves it unknown.
		if data, err := os.ReadFile(filepath.Join(n.Proc, "cgroup")); err == nil {
			n.PodUID = PodUIDFromCgroup(data)
		}
	}
	return n, nil
}

// candidates lists each distinct namespace once, with the best path to open it: a
// bind mount when there is one (it outlives processes), else the oldest process's
// (the sandbox's pause process, which lives as long as the pod). The host's own
// namespace is searched too: which namespace "self" is cannot be trusted in a Go
// process (/proc/self is the main thread, which a locked goroutine may have left
// in another namespace), and one more namespace costs microseconds.
func (f *ProcFinder) candidates() ([]*nsCandidate, error) {
	byInode := map[uint64]*nsCandidate{}
	var order []uint64
	for _, dir := range f.Dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // a runtime that does not use this directory
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			ino, err := bindMountInode(p)
			if err != nil {
				continue
			}
			if c, ok := byInode[ino]; ok {
				if !c.bind {
					c.path, c.bind = p, true
				}
				continue
			}
			byInode[ino] = &nsCandidate{inode: ino, path: p, bind: true}
			order = append(order, ino)
		}
	}
	procs, err := os.ReadDir(f.ProcDir)
	if err != nil {
		return nil, fmt.Errorf("find network namespace: read %s: %w", f.ProcDir, err)
	}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		p := filepath.Join(f.ProcDir, e.Name(), "ns", "net")
		ino, err := nsInode(p)
		if err != nil {
			continue // kernel threads and exited processes
		}
		started, err := startTime(filepath.Join(f.ProcDir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		c, ok := byInode[ino]
		if !ok {
			c = &nsCandidate{inode: ino, path: p, started: started}
			byInode[ino] = c
			order = append(order, ino)
		} else if !c.bind && (c.pids == 0 || started < c.started) {
			c.path = p
		}
		if c.pids == 0 || started < c.started {
			c.started = started
			c.proc = filepath.Join(f.ProcDir, e.Name())
		}
		c.pids++
	}
	out := make([]*nsCandidate, 0, len(order))
	for _, ino := range order {
		out = append(out, byInode[ino])
	}
	return out, nil
}

// holds opens the candidate, checks it is still the namespace listed (a pid may
// have been reused) and looks for the addresses inside.
func holds(c *nsCandidate, ips []netip.Addr) (*Netns, bool, error) {
	file, err := os.Open(c.path)
	if err != nil {
		return nil, false, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil || st.Ino != c.inode {
		file.Close()
		return nil, false, fmt.Errorf("namespace at %s changed", c.path)
	}
	n := &Netns{Path: fmt.Sprintf("/proc/self/fd/%d", file.Fd()), Source: c.path, Inode: c.inode, Proc: c.proc, file: file}
	var match bool
	addrs, err := netns.Addrs(n.Path)
	for _, a := range addrs {
		match = match || slices.Contains(ips, a)
	}
	if err != nil || !match {
		file.Close()
		return nil, false, err
	}
	return n, true, nil
}

// nsInode reads the namespace inode from a /proc/PID/ns/net link ("net:[INODE]")
// without entering or even opening it.
func nsInode(link string) (uint64, error) {
	target, err := os.Readlink(link)
	if err != nil {
		return 0, err
	}
	s, ok := strings.CutPrefix(target, "net:[")
	if !ok || !strings.HasSuffix(s, "]") {
		return 0, fmt.Errorf("%s: unexpected link %q", link, target)
	}
	return strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
}

// bindMountInode returns the namespace inode of a bind-mounted namespace file; a
// plain file (a mount point whose namespace is gone) is an error.
func bindMountInode(path string) (uint64, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return 0, err
	}
	if sfs.Type != unix.NSFS_MAGIC {
		return 0, fmt.Errorf("%s is not a namespace", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// startTime is field 22 of /proc/PID/stat, read after the command name, which may
// hold spaces and parentheses.
func startTime(statPath string) (uint64, error) {
	b, err := os.ReadFile(statPath)
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", statPath)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("%s: %d fields", statPath, len(fields))
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
