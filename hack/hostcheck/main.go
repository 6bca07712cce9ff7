// Command hostcheck records what a test run could change on this machine and says
// what changed: `make test` saves a record before the tests and compares after, and
// fails when the run left anything behind or changed a setting.
//
//	hostcheck save FILE [DIR...]      record the host now
//	hostcheck compare FILE [DIR...]   compare the host now with FILE; exit 1 on a difference
//
// Each DIR is left out too (with everything below it): hack/test.sh passes the
// build cache, Go's caches and the checkout, wherever they are.
// The record holds every path under the trees where the node harness, the runtimes
// and the tests could write (/etc, /opt, /run, /var, /tmp, /srv, /home, /usr/local,
// /root) with its type, except caches that are meant to stay (the build cache of
// hack/*.sh, Go's caches, apt's and dpkg's state, the journal); the host's sysctls;
// the mount points; the network links, addresses and routes of the host's network
// namespace; the iptables tables and chains (legacy and nft) and nftables tables;
// and processes of the components the tests start. Kernel modules that appeared are
// reported, not failed: they cannot be unloaded safely, and loading them is the
// kernel's business (on this machine everything is built in).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// roots are walked for paths; skip are left out with everything below them.
var (
	roots = []string{"/etc", "/opt", "/run", "/var", "/tmp", "/srv", "/home", "/usr/local", "/root"}
	skip  = []string{
		"/var/cache/istio-cni", // hack/*.sh's build cache, meant to stay
		"/var/cache/apt", "/var/lib/apt", "/var/lib/dpkg", "/var/log/apt", "/var/log/journal",
		"/var/cache/debconf", "/var/cache/ldconfig", "/etc/ld.so.cache",
		"/root/.cache", "/root/go", "/root/.npm", "/root/.config/go",
		"/usr/local/go",
		"/run/systemd", "/run/user", "/run/log", "/run/utmp", "/var/log/wtmp", "/var/log/lastlog", "/var/log/btmp",
		// iptables' lock, which every iptables command of a boot opens (creating
		// it if missing) and none removes: on a machine fresh from boot the run's
		// first iptables command makes it. It is the host's, shared with every
		// other iptables user, and removing it while one holds it would break
		// their lock, so it is neither the run's leftover nor its to clean.
		"/run/xtables.lock",
	}
	// sessionShell is an interactive tool's scratch space, not the tests'.
	sessionShell = regexp.MustCompile(`^/tmp/bash_(jobs|tool)[._]`)
	// volatileSysctls change by themselves.
	volatileSysctls = regexp.MustCompile(`^(fs/(dentry-state|file-nr|inode-nr|inode-state|quota/.*)|kernel/(random/.*|ns_last_pid|pty/nr|tainted|sched_.*)|net/netfilter/nf_conntrack_count|net/ipv[46]/route/.*|net/ipv[46]/neigh/.*|net/ipv[46]/conf/[^/]+/.*|vm/(stat_refresh|drop_caches|compact_memory|nr_.*)|user/.*)$`)
	// confSysctls are the per-interface settings compared: the ones that apply
	// to interfaces created later.
	confSysctls = regexp.MustCompile(`^net/ipv[46]/conf/(all|default)/`)
	goBuildDir  = regexp.MustCompile(`^/tmp/go-build[0-9]+$`)
	// components are processes the tests start; one left running is a leak.
	components = regexp.MustCompile(`^(containerd|containerd-shim.*|runc|kubelet|kube-apiserver|kube-scheduler|kube-controller-manager|kube-proxy|etcd|pause|install-cni|istio-cni|istio-iptables|istio-cni-doctor|proxy-standin|capture-demo|node)$`)
)

type record struct {
	Paths     map[string]string `json:"paths"` // path -> type (d, f, l, s, p, c, b)
	Sysctls   map[string]string `json:"sysctls"`
	Mounts    []string          `json:"mounts"`
	Links     []string          `json:"links"`
	Addresses []string          `json:"addresses"`
	Routes    []string          `json:"routes"`
	Netfilter []string          `json:"netfilter"` // "iptables-legacy filter INPUT", "nft table inet foo"
	Processes []string          `json:"processes"` // "name" (pids change)
	Modules   []string          `json:"modules"`
}

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "save" && os.Args[1] != "compare") {
		fmt.Fprintln(os.Stderr, "usage: hostcheck save|compare FILE [DIR...]")
		os.Exit(2)
	}
	for _, d := range os.Args[3:] {
		if d != "" {
			skip = append(skip, filepath.Clean(d))
		}
	}
	now, err := take()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostcheck:", err)
		os.Exit(1)
	}
	file := os.Args[2]
	if os.Args[1] == "save" {
		data, _ := json.Marshal(now)
		if err := os.WriteFile(file, data, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "hostcheck:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "hostcheck: recorded %d paths, %d sysctls, %d mounts, %d netfilter objects\n",
			len(now.Paths), len(now.Sysctls), len(now.Mounts), len(now.Netfilter))
		return
	}
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostcheck:", err)
		os.Exit(1)
	}
	var before record
	if err := json.Unmarshal(data, &before); err != nil {
		fmt.Fprintf(os.Stderr, "hostcheck: %s: %v\n", file, err)
		os.Exit(1)
	}
	diffs, notes := compare(&before, now)
	for _, n := range notes {
		fmt.Fprintln(os.Stderr, "hostcheck: note:", n)
	}
	if len(diffs) > 0 {
		fmt.Fprintf(os.Stderr, "hostcheck: the run left the host changed (%d differences):\n", len(diffs))
		for _, d := range diffs {
			fmt.Fprintln(os.Stderr, "  "+d)
		}
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "hostcheck: the host is as before the run (%d paths, %d sysctls, %d mounts, %d netfilter objects compared)\n",
		len(now.Paths), len(now.Sysctls), len(now.Mounts), len(now.Netfilter))
}

// skipped says whether p is left out of the record: one of skip or below one.
func skipped(p string) bool {
	for _, s := range skip {
		if p == s || strings.HasPrefix(p, s+"/") {
			return true
		}
	}
	return false
}

func take() (*record, error) {
	r := &record{Paths: map[string]string{}, Sysctls: map[string]string{}}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
					return nil
				}
				return err
			}
			if skipped(p) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if goBuildDir.MatchString(p) || sessionShell.MatchString(p) { // go's own work dirs, a session's shell
				return filepath.SkipDir
			}
			r.Paths[p] = typeOf(d.Type())
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", root, err)
		}
	}
	_ = filepath.WalkDir("/proc/sys", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		key := strings.TrimPrefix(p, "/proc/sys/")
		if volatileSysctls.MatchString(key) && !confSysctls.MatchString(key) {
			return nil
		}
		if v, err := os.ReadFile(p); err == nil {
			r.Sysctls[key] = strings.TrimSpace(string(v))
		}
		return nil
	})
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 {
				r.Mounts = append(r.Mounts, fields[4])
			}
		}
		f.Close()
	}
	r.Links = lines("ip", "-o", "link", "show")
	for i, l := range r.Links { // "3: eth0: <...> ..." -> "eth0"
		if f := strings.Fields(l); len(f) > 1 {
			r.Links[i] = strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range lines("ip", fam, "-o", "addr", "show") {
			if f := strings.Fields(l); len(f) > 3 {
				r.Addresses = append(r.Addresses, f[1]+" "+f[3])
			}
		}
		for _, l := range lines("ip", fam, "route", "show", "table", "all") {
			r.Routes = append(r.Routes, strings.Join(strings.Fields(l), " "))
		}
	}
	r.Netfilter = netfilter()
	r.Processes = processes()
	if entries, err := os.ReadDir("/sys/module"); err == nil {
		for _, e := range entries {
			r.Modules = append(r.Modules, e.Name())
		}
	}
	for _, l := range [][]string{r.Mounts, r.Links, r.Addresses, r.Routes, r.Netfilter, r.Processes, r.Modules} {
		sort.Strings(l)
	}
	return r, nil
}

func typeOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "d"
	case m&fs.ModeSymlink != 0:
		return "l"
	case m&fs.ModeSocket != 0:
		return "s"
	case m&fs.ModeNamedPipe != 0:
		return "p"
	case m&fs.ModeCharDevice != 0:
		return "c"
	case m&fs.ModeDevice != 0:
		return "b"
	}
	return "f"
}

func lines(name string, args ...string) []string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return nil
	}
	var l []string
	for _, s := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if s != "" {
			l = append(l, s)
		}
	}
	return l
}

// netfilter lists tables and chains without loading anything: the legacy tables
// only when their kernel interface is already there, nft only through nft.
func netfilter() []string {
	var out []string
	for _, t := range []struct{ save, names string }{
		{"iptables-legacy-save", "/proc/net/ip_tables_names"},
		{"ip6tables-legacy-save", "/proc/net/ip6_tables_names"},
	} {
		names, err := os.ReadFile(t.names)
		if err != nil || len(bytes.TrimSpace(names)) == 0 {
			continue
		}
		out = append(out, chains(t.save, lines(t.save))...)
	}
	// iptables-nft's tables are nftables tables ("table ip filter"), so the nft
	// listing covers them; their chains come from nft too.
	var table string
	for _, l := range lines("nft", "list", "ruleset") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "table":
			table = f[1] + " " + f[2]
			out = append(out, "nft table "+table)
		case len(f) >= 2 && f[0] == "chain":
			out = append(out, "nft chain "+table+" "+f[1])
		case len(f) >= 2 && f[0] == "set":
			out = append(out, "nft set "+table+" "+f[1])
		}
	}
	return out
}

func chains(tool string, save []string) []string {
	var out []string
	var table string
	for _, l := range save {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			out = append(out, tool+" "+table+" "+strings.Fields(l[1:])[0])
		}
	}
	return out
}

func processes() []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue
		}
		if name := strings.TrimSpace(string(comm)); components.MatchString(name) {
			out = append(out, name)
		}
	}
	return out
}

func compare(before, after *record) (diffs, notes []string) {
	for _, p := range slices.Sorted(maps.Keys(after.Paths)) {
		if t, ok := before.Paths[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("path appeared: %s (%s)", p, after.Paths[p]))
		} else if t != after.Paths[p] {
			diffs = append(diffs, fmt.Sprintf("path changed type: %s (%s -> %s)", p, t, after.Paths[p]))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(before.Paths)) {
		if _, ok := after.Paths[p]; !ok && !strings.HasPrefix(p, "/tmp/") {
			diffs = append(diffs, fmt.Sprintf("path removed: %s (%s)", p, before.Paths[p]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(before.Sysctls)) {
		if v, ok := after.Sysctls[k]; ok && v != before.Sysctls[k] {
			diffs = append(diffs, fmt.Sprintf("sysctl %s: %q -> %q", strings.ReplaceAll(k, "/", "."), before.Sysctls[k], v))
		}
	}
	for _, s := range []struct {
		what          string
		before, after []string
	}{
		{"mount", before.Mounts, after.Mounts},
		{"link", before.Links, after.Links},
		{"address", before.Addresses, after.Addresses},
		{"route", before.Routes, after.Routes},
		{"netfilter", before.Netfilter, after.Netfilter},
		{"process", before.Processes, after.Processes},
	} {
		added, removed := setDiff(s.before, s.after)
		for _, a := range added {
			diffs = append(diffs, fmt.Sprintf("%s appeared: %s", s.what, a))
		}
		for _, r := range removed {
			if s.what == "process" { // something that ran before the run ended: not the run's doing
				notes = append(notes, "process gone: "+r)
				continue
			}
			diffs = append(diffs, fmt.Sprintf("%s gone: %s", s.what, r))
		}
	}
	if added, _ := setDiff(before.Modules, after.Modules); len(added) > 0 {
		notes = append(notes, "kernel modules loaded during the run: "+strings.Join(added, " "))
	}
	return diffs, notes
}

// setDiff compares two sorted lists as multisets.
func setDiff(before, after []string) (added, removed []string) {
	count := map[string]int{}
	for _, b := range before {
		count[b]++
	}
	for _, a := range after {
		count[a]--
	}
	for _, k := range slices.Sorted(maps.Keys(count)) {
		for ; count[k] < 0; count[k]++ {
			added = append(added, k)
		}
		for ; count[k] > 0; count[k]-- {
			removed = append(removed, k)
		}
	}
	return added, removed
}
