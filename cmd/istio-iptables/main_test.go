package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/test/harness/testns"

	"github.com/istio-cni/istio-cni/test/harness/golden"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// The binary is built once, into a directory every user can read: the validation
// runs it as the proxy uid.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// lockDir holds the xtables lock the binary uses under test (XTABLES_LOCKFILE),
// instead of the default under the host's /run.
var lockDir string

func TestMain(m *testing.M) {
	flag.Parse()
	var err error
	if lockDir, err = os.MkdirTemp("", "istio-iptables-lock-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.RemoveAll(lockDir)
	os.Exit(code)
}

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "istio-iptables-test-")
		if buildErr != nil {
			return
		}
		if buildErr = os.Chmod(binDir, 0o755); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "istio-iptables")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("build istio-iptables: %v", buildErr)
	}
	return binPath
}

// baseEnv keeps the host's environment (a DRY_RUN, an ISTIO_INBOUND_PORTS) out of the runs
// and makes the proxy uid default deterministic (no such user: 1337).
func baseEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "ENVOY_USER=istio-iptables-test-no-such-user",
		"XTABLES_LOCKFILE=" + filepath.Join(lockDir, "xtables.lock")}, extra...)
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", cmd.Args, err)
	}
	return result{code, stdout.String(), stderr.String()}
}

// inFreshNetns makes cmd start in a network namespace of its own (and, without
// root, a user namespace), so that what it detects does not depend on the host.
func inFreshNetns(cmd *exec.Cmd) {
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if os.Geteuid() != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	cmd.SysProcAttr = attr
}

// newPodNetns makes a throwaway namespace, optionally with pod addresses on a veth.
func newPodNetns(t *testing.T, addrs ...string) string {
	t.Helper()
	root.Require(t)
	path, err := testns.New(t.TempDir(), "pod")
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := testns.Delete(path); err != nil {
			t.Errorf("delete namespace: %v", err)
		}
	})
	if len(addrs) == 0 {
		return path
	}
	err = netns.Do(path, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(veth); err != nil {
			return err
		}
		for _, a := range addrs {
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			addr.Flags = syscall.IFA_F_NODAD
			if err := netlink.AddrAdd(veth, addr); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up pod addresses: %v", err)
	}
	return path
}

// runInNetns runs the binary inside the namespace at ns as uid (and gid) uid,
// without --network-namespace: the way an init container runs it.
func runInNetns(t *testing.T, ns string, uid uint32, args ...string) result {
	t.Helper()
	var r result
	err := netns.Do(ns, func() error {
		cmd := exec.Command(binary(t), args...)
		cmd.Env = baseEnv()
		if uid != 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		}
		r = run(t, cmd)
		return nil
	})
	if err != nil {
		t.Fatalf("enter namespace: %v", err)
	}
	return r
}

func TestDryRunPrintsGoldenRules(t *testing.T) {
	resolvConf, err := filepath.Abs("testdata/resolv.conf")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  []string
		// podAddrs, when set, runs in a namespace with these addresses (needs root).
		podAddrs []string
	}{
		{
			name: "istio-init-defaults",
			args: []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--dry-run"},
		},
		{
			name: "tproxy",
			args: []string{"-m", "TPROXY", "-i", "*", "-b", "*", "-d", "15020", "-n"},
		},
		{
			name: "dns-servers-from-resolv-conf",
			args: []string{"--redirect-dns", "--resolv-conf", resolvConf, "-i", "10.0.0.0/8", "-b", "80,443", "-n"},
		},
		{
			name: "environment-only",
			env: []string{"ISTIO_SERVICE_CIDR=10.96.0.0/12", "ISTIO_INBOUND_PORTS=8080", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=999",
				"ISTIO_META_DNS_CAPTURE=true", "CAPTURE_ALL_DNS=true", "INVALID_DROP=true", "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE=3306",
				"PROXY_UID=1500", "DRY_RUN=true"},
		},
		{
			name: "native-nftables",
			args: []string{"--native-nftables", "-i", "*", "-b", "*", "-d", "15090,15021,15020", "--dry-run"},
		},
		{
			name:     "ipv6-pod",
			args:     []string{"-i", "*", "-b", "*", "-d", "15020", "--redirect-dns", "--resolv-conf", resolvConf, "--dry-run"},
			podAddrs: []string{"fd00::2/64"},
		},
		{
			name:     "dual-stack-pod-without-dual-stack-is-ipv4",
			args:     []string{"-i", "*", "-b", "*", "--dry-run"},
			podAddrs: []string{"10.1.0.2/24", "fd00::2/64"},
		},
		{
			name:     "dual-stack-pod-with-dual-stack-nftables",
			args:     []string{"-i", "*", "-b", "*", "--dual-stack", "--native-nftables", "--dry-run"},
			podAddrs: []string{"10.1.0.2/24", "fd00::2/64"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			var cmd *exec.Cmd
			if len(tc.podAddrs) > 0 {
				ns := newPodNetns(t, tc.podAddrs...)
				cmd = exec.Command(binary(t), append([]string{"--network-namespace", ns}, args...)...)
			} else {
				cmd = exec.Command(binary(t), args...)
				inFreshNetns(cmd)
			}
			cmd.Env = baseEnv(tc.env...)
			r := run(t, cmd)
			if r.code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
			}
			golden.Check(t, filepath.Join("testdata", tc.name+".golden"), []byte(r.stdout))
		})
	}
}

func TestInvalidValuesExitOneNamingTheFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"inbound port out of range", []string{"-b", "70000"}, nil, []string{"-b/--istio-inbound-ports", `"70000"`}},
		{"interface name with a shell metacharacter", []string{"-c", "eth0;rm"}, nil, []string{"-c/--istio-exclude-interfaces", `"eth0;rm"`}},
		{"CIDR from an annotation", []string{"-i", "10.0.0.0/8,evil"}, nil, []string{"-i/--istio-service-cidr", `"evil"`}},
		{"bad environment variable", nil, []string{"ISTIO_LOCAL_EXCLUDE_PORTS=15020,x"}, []string{"ISTIO_LOCAL_EXCLUDE_PORTS", `"x"`}},
		{"unknown flag", []string{"--frobnicate"}, nil, []string{"--frobnicate"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(binary(t), append(tc.args, "--dry-run")...)
			cmd.Env = baseEnv(tc.env...)
			r := run(t, cmd)
			if r.code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not name %s:\n%s", w, r.stderr)
				}
			}
			for _, bad := range []string{"goroutine ", "panic", "Usage"} {
				if strings.Contains(r.stderr, bad) {
					t.Errorf("stderr contains %q:\n%s", bad, r.stderr)
				}
			}
			if r.stdout != "" {
				t.Errorf("stdout is not empty:\n%s", r.stdout)
			}
		})
	}
}

// leftovers lists what of ours any iptables flavour or nftables still holds in ns.
func leftovers(t *testing.T, ns string) []string {
	t.Helper()
	var found []string
	err := netns.Do(ns, func() error {
		for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save", "nft"} {
			args := []string{}
			if tool == "nft" {
				args = []string{"list", "ruleset"}
			}
			out, err := exec.Command(tool, args...).CombinedOutput()
			if err != nil {
				return errors.New(tool + ": " + string(out))
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "ISTIO_") || strings.Contains(line, "istio-proxy") {
					found = append(found, tool+": "+line)
				}
			}
		}
		// TPROXY's policy routing: fwmark 1337 -> table 133.
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(fam)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == 133 {
					found = append(found, fmt.Sprintf("ip rule: fwmark %d lookup %d", r.Mark, r.Table))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list rules: %v", err)
	}
	return found
}

var backends = []struct {
	name string
	args []string
}{
	{"iptables", nil},
	{"iptables-legacy", []string{"--iptables-mode", "legacy"}},
	{"nftables", []string{"--native-nftables"}},
}

var modes = []struct {
	name string
	args []string
}{
	{"redirect", []string{"-m", "REDIRECT"}},
	{"tproxy", []string{"-m", "TPROXY"}},
}

var validationArgs = []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
	"-d", "15090,15021,15020", "--run-validation", "--skip-rule-apply", "--probe-timeout", "1s"}

func TestApplyValidateCleanupInRealNamespace(t *testing.T) {
	root.Require(t)
	for _, b := range backends {
		for _, m := range modes {
			t.Run(b.name+"/"+m.name, func(t *testing.T) {
				testApplyValidateCleanup(t, append(slices.Clone(b.args), m.args...))
			})
		}
	}
}

func testApplyValidateCleanup(t *testing.T, backendArgs []string) {
	ns := newPodNetns(t, "10.1.0.2/24")
	apply := append([]string{"--network-namespace", ns, "-u", "1337", "-i", "*", "-b", "*", "-d", "15090,15021,15020"}, backendArgs...)
	for i := range 2 { // the second apply proves it is idempotent
		cmd := exec.Command(binary(t), apply...)
		cmd.Env = baseEnv()
		r := run(t, cmd)
		if r.code != 0 {
			t.Fatalf("apply #%d: exit %d, stderr:\n%s", i+1, r.code, r.stderr)
		}
		if i == 1 && !strings.Contains(r.stderr, "changed=false") {
			t.Errorf("second apply changed the namespace; stderr:\n%s", r.stderr)
		}
	}
	if len(leftovers(t, ns)) == 0 {
		t.Fatal("no ISTIO_ rules after apply")
	}

	if r := runInNetns(t, ns, 1337, validationArgs...); r.code != 0 {
		t.Errorf("validation as the proxy uid: exit %d, want 0; stderr:\n%s", r.code, r.stderr)
	}
	// Only the proxy's loopback traffic goes to the inbound capture port: the
	// same probe from root is an app talking to itself and stays uncaptured.
	r := runInNetns(t, ns, 0, validationArgs...)
	if r.code != 126 || !strings.Contains(r.stderr, "run it as the proxy uid") {
		t.Errorf("validation as root: exit %d, want 126 with a hint about the uid; stderr:\n%s", r.code, r.stderr)
	}

	// As in Istio, --skip-rule-apply skips the removal as well.
	skipped := append([]string{"--network-namespace", ns, "--cleanup-only", "--skip-rule-apply"}, backendArgs...)
	cmd := exec.Command(binary(t), skipped...)
	cmd.Env = baseEnv()
	if r := run(t, cmd); r.code != 0 {
		t.Fatalf("cleanup with --skip-rule-apply: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if len(leftovers(t, ns)) == 0 {
		t.Error("--cleanup-only --skip-rule-apply removed the capture")
	}

	cleanup := append([]string{"--network-namespace", ns, "--cleanup-only"}, backendArgs...)
	cmd = exec.Command(binary(t), cleanup...)
	cmd.Env = baseEnv()
	if r := run(t, cmd); r.code != 0 {
		t.Fatalf("cleanup: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if left := leftovers(t, ns); len(left) > 0 {
		t.Errorf("after --cleanup-only:\n%s", strings.Join(left, "\n"))
	}
	if r := runInNetns(t, ns, 1337, validationArgs...); r.code != 126 {
		t.Errorf("validation after cleanup: exit %d, want 126; stderr:\n%s", r.code, r.stderr)
	}
}

func TestValidationWithoutRulesExits126SayingTrafficIsNotRedirected(t *testing.T) {
	root.Require(t)
	ns := newPodNetns(t, "10.1.0.2/24")
	r := runInNetns(t, ns, 1337, validationArgs...)
	if r.code != 126 {
		t.Fatalf("exit %d, want 126; stderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"traffic is not being redirected", "127.0.0.6:15002", "istio-cni"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "run it as the proxy uid") {
		t.Errorf("stderr blames the uid although the probe ran as the proxy:\n%s", r.stderr)
	}
}

func TestValidationProbesIPv6InAnIPv6Pod(t *testing.T) {
	root.Require(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ns := newPodNetns(t, "fd00::2/64")
			cmd := exec.Command(binary(t), append([]string{"--network-namespace", ns, "-u", "1337", "-i", "*", "-b", "*"}, b.args...)...)
			cmd.Env = baseEnv()
			if r := run(t, cmd); r.code != 0 {
				t.Fatalf("apply: exit %d, stderr:\n%s", r.code, r.stderr)
			}
			r := runInNetns(t, ns, 1337, validationArgs...)
			if r.code != 0 {
				t.Fatalf("validation: exit %d, want 0; stderr:\n%s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, "[::6]:15002") {
				t.Errorf("the IPv6 probe did not run; stderr:\n%s", r.stderr)
			}
		})
	}
}

// istiosNativeTables is a namespace as Istio's own istio-iptables --native-nftables
// leaves it (inet tables istio-proxy-nat, -mangle and -raw, with hooked chains,
// jumps and redirects; written for this test), beside tables that are not
// Istio's: one of a similar name and a filter of the node's.
const istiosNativeTables = `
table inet istio-proxy-nat {
	chain prerouting { type nat hook prerouting priority dstnat; policy accept; meta l4proto tcp jump istio-inbound; }
	chain output { type nat hook output priority -100; policy accept; jump istio-output; }
	chain istio-inbound { tcp dport 15008 return; meta l4proto tcp jump istio-in-redirect; }
	chain istio-in-redirect { meta l4proto tcp redirect to :15006; }
	chain istio-output { meta skuid 1337 return; meta l4proto tcp redirect to :15001; }
}
table inet istio-proxy-mangle {
	chain prerouting { type filter hook prerouting priority mangle; policy accept; meta mark 1337 ct mark set 1337; }
}
table inet istio-proxy-raw {
	chain output { type filter hook output priority raw; policy accept; udp dport 53 meta skuid 1337 ct zone set 1; }
}
table inet istio-proxy-telemetry {
	chain input { type filter hook input priority filter; policy accept; counter; }
}
table inet filter {
	chain input { type filter hook input priority filter; policy accept; tcp dport 22 accept; }
}
`

// TestNftablesCleanupRemovesIstiosOwnTables: --cleanup-only --native-nftables
// removes the tables Istio's own tool writes in its nftables mode, as Istio's
// --cleanup-only does, and nothing else: a table of a similar name and a foreign
// one stay. The iptables cleanup leaves Istio's nftables tables alone, as Istio's
// does.
func TestNftablesCleanupRemovesIstiosOwnTables(t *testing.T) {
	tables := func(ns string) []string {
		t.Helper()
		var out []byte
		err := netns.Do(ns, func() error {
			var err error
			out, err = exec.Command("nft", "list", "tables").CombinedOutput()
			return err
		})
		if err != nil {
			t.Fatalf("nft list tables: %v: %s", err, out)
		}
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				names = append(names, strings.TrimPrefix(l, "table "))
			}
		}
		slices.Sort(names)
		return names
	}
	foreign := []string{"inet filter", "inet istio-proxy-telemetry"}
	all := slices.Sorted(slices.Values(append(slices.Clone(foreign), nftables.IstioNativeTables...)))
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"native nftables", []string{"--native-nftables"}, foreign},
		{"iptables", nil, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newPodNetns(t, "10.1.0.2/24")
			err := netns.Do(ns, func() error {
				cmd := exec.Command("nft", "-f", "-")
				cmd.Stdin = strings.NewReader(istiosNativeTables)
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("load Istio's tables: %v", err)
			}
			if got := tables(ns); !slices.Equal(got, all) {
				t.Fatalf("tables before the cleanup: %q, want %q", got, all)
			}
			cmd := exec.Command(binary(t), append([]string{"--network-namespace", ns, "--cleanup-only"}, tc.args...)...)
			cmd.Env = baseEnv()
			if r := run(t, cmd); r.code != 0 {
				t.Fatalf("cleanup: exit %d, stderr:\n%s", r.code, r.stderr)
			}
			if diff := cmp.Diff(tc.want, tables(ns)); diff != "" {
				t.Errorf("tables after --cleanup-only %s (-want +got):\n%s", strings.Join(tc.args, " "), diff)
			}
		})
	}
}
