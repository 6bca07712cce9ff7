package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

func newNS(t *testing.T) string {
	t.Helper()
	path, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(path) })
	return path
}

// runIn runs iptables-save (or another command) in the namespace.
func runIn(t *testing.T, ns string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	// iptables-legacy takes the xtables lock for a rule change: a file of the test's,
	// not the host's /run/xtables.lock.
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(t.TempDir(), "xtables.lock"))
	return testns.Run(t, ns, cmd)
}

type backendCase struct {
	name string
	opts specs.Settings
}

var backendCases = []backendCase{
	{"default-sidecar", specs.Sidecar()},
	{"tproxy-dns-ipv6", specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "10.0.0.0/8,fd00::/8", redirect.FieldRedirectDNS: "true", redirect.FieldDNSServers: "10.96.0.10,fd00::10", redirect.FieldExcludeInterfaces: "eth9", redirect.FieldIPv6: "true"}},
	{"virt-groups-drop", specs.Settings{redirect.FieldRerouteVirtualInterfaces: "eth1,eth2", redirect.FieldOutboundCIDRs: "*", redirect.FieldInboundPorts: "80,443", redirect.FieldOwnerGroupsExclude: "888,root", redirect.FieldDropInvalid: "true", redirect.FieldRedirectDNS: "true", redirect.FieldCaptureAllDNS: "true", redirect.FieldProxyUIDs: "1337,1338", redirect.FieldProxyGIDs: "1337"}},
}

func modes(t *testing.T) []Mode {
	var ms []Mode
	for _, m := range []Mode{ModeNFT, ModeLegacy} {
		if _, err := exec.LookPath("iptables-" + string(m) + "-restore"); err != nil {
			t.Fatalf("iptables-%s-restore not installed: %v", m, err)
		}
		ms = append(ms, m)
	}
	return ms
}

// TestApplyIsIdempotentVerifiedAndCleanedUp proves, for each mode and case, in a real
// namespace that already holds a foreign rule: apply programs exactly the plan (verify
// finds nothing), a second apply changes nothing, deleting one of our rules by hand is
// reported by verify and repaired by apply, and cleanup restores the namespace's
// original rules exactly.
func TestApplyIsIdempotentVerifiedAndCleanedUp(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	eachModeAndCase(t, func(t *testing.T, mode Mode, tc backendCase, b *Backend) {
		ns := newNS(t)
		ipt := "iptables-" + string(mode)
		runIn(t, ns, ipt, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-j", "RETURN")
		runIn(t, ns, ipt, "-t", "nat", "-N", "FOREIGN")
		before4 := rulestext.Saved(runIn(t, ns, ipt+"-save"))
		before6 := rulestext.Saved(runIn(t, ns, "ip6tables-"+string(mode)+"-save"))
		plan := tc.opts.Plan(t)

		changed, err := capture.Apply(ctx, ns, b, plan)
		if err != nil || !changed {
			t.Fatalf("first apply: changed=%v err=%v", changed, err)
		}
		if diffs, err := capture.Verify(ctx, ns, b, plan); err != nil || len(diffs) > 0 {
			t.Fatalf("verify after apply: %v %q\n%s", err, diffs, runIn(t, ns, ipt+"-save"))
		}
		after := runIn(t, ns, ipt+"-save")
		if !strings.Contains(after, "-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN") || !strings.Contains(after, ":FOREIGN") {
			t.Errorf("apply touched a foreign rule or chain:\n%s", after)
		}
		changed, err = capture.Apply(ctx, ns, b, plan)
		if err != nil || changed {
			t.Fatalf("second apply: changed=%v err=%v, want no change", changed, err)
		}
		// Break one of our rules by hand.
		runIn(t, ns, ipt, "-t", "nat", "-D", "ISTIO_REDIRECT", "1")
		diffs, err := capture.Verify(ctx, ns, b, plan)
		if err != nil || len(diffs) == 0 {
			t.Fatalf("verify missed a deleted rule: %v %q", err, diffs)
		}
		if !strings.Contains(strings.Join(diffs, "\n"), "ISTIO_REDIRECT") {
			t.Errorf("verify does not name the broken chain: %q", diffs)
		}
		if changed, err := capture.Apply(ctx, ns, b, plan); err != nil || !changed {
			t.Fatalf("repairing apply: changed=%v err=%v", changed, err)
		}
		if diffs, err := capture.Verify(ctx, ns, b, plan); err != nil || len(diffs) > 0 {
			t.Fatalf("verify after repair: %v %q", err, diffs)
		}
		if _, err := capture.Cleanup(ctx, ns, b, plan); err != nil {
			t.Fatal(err)
		}
		if got := rulestext.Saved(runIn(t, ns, ipt+"-save")); got != before4 {
			t.Errorf("cleanup left IPv4 state different:\nbefore:\n%s\nafter:\n%s", before4, got)
		}
		if got := rulestext.Saved(runIn(t, ns, "ip6tables-"+string(mode)+"-save")); got != before6 {
			t.Errorf("cleanup left IPv6 state different:\nbefore:\n%s\nafter:\n%s", before6, got)
		}
		if rules := runIn(t, ns, "ip", "rule"); strings.Contains(rules, "lookup 133") {
			t.Errorf("cleanup left the TPROXY rule: %s", rules)
		}
	})
}

// eachModeAndCase runs f as a subtest for every iptables mode of this machine and
// every backend case, with a new backend of that mode.
func eachModeAndCase(t *testing.T, f func(t *testing.T, mode Mode, tc backendCase, b *Backend)) {
	t.Helper()
	for _, mode := range modes(t) {
		for _, tc := range backendCases {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				b, err := NewBackend(Config{Mode: mode, LockDir: dir, NativeStateDir: dir})
				if err != nil {
					t.Fatal(err)
				}
				f(t, mode, tc, b)
			})
		}
	}
}

// runWays are the two ways run starts a tool: in this process's user namespace,
// and in a pod's that owns the network namespace (hostUsers: false), each from a
// thread in that network namespace. run calls fn there with the user namespace.
var runWays = []struct {
	name string
	run  func(t *testing.T, fn func(u userNS))
}{
	{"the node's user namespace", func(t *testing.T, fn func(u userNS)) { fn(ownUserNS) }},
	{"a pod's user namespace", func(t *testing.T, fn func(u userNS)) {
		root.Require(t)
		ns := testns.NewInUserNamespace(t)
		if err := netns.Do(ns, func() error {
			u := podUserNamespace()
			defer u.close()
			if u == ownUserNS {
				return fmt.Errorf("%s: podUserNamespace found it owned by this process's user namespace", ns)
			}
			fn(u)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}},
}

// TestRunBoundsWhatItReads: an iptables tool whose output passes MaxOutputBytes
// fails naming the bound; its stderr is kept to its first maxStderrBytes. The
// same in a pod's user namespace.
func TestRunBoundsWhatItReads(t *testing.T) {
	for _, way := range runWays {
		t.Run(way.name, func(t *testing.T) {
			b, err := NewBackend(Config{LockDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			way.run(t, func(u userNS) {
				out, err := b.run(ctx, u, "/bin/sh", "", "-c", fmt.Sprintf("head -c %d /dev/zero", MaxOutputBytes))
				if err != nil || len(out) != MaxOutputBytes {
					t.Fatalf("output of exactly the bound: %d bytes, %v; want it whole", len(out), err)
				}
				_, err = b.run(ctx, u, "/bin/sh", "", "-c", fmt.Sprintf("head -c %d /dev/zero", MaxOutputBytes+1))
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("output is over %d bytes", MaxOutputBytes)) {
					t.Fatalf("output over the bound: %v; want an error naming the bound", err)
				}
				_, err = b.run(ctx, u, "/bin/sh", "", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x >&2; exit 3", 4*maxStderrBytes))
				if err == nil || !strings.Contains(err.Error(), "exit status 3") {
					t.Fatalf("failing tool: %v; want its exit status", err)
				}
				msg := err.Error()
				if n := len(msg[strings.LastIndex(msg, ": ")+2:]); n != maxStderrBytes {
					t.Errorf("stderr kept in the error: %d bytes, want the first %d", n, maxStderrBytes)
				}
				out, err = b.run(ctx, u, "/bin/sh", "line one\nline two\n", "-c", "wc -l")
				if err != nil || strings.TrimSpace(out) != "2" {
					t.Errorf("a tool reading its stdin: %q, %v; want it to count 2 lines", out, err)
				}
			})
		})
	}
}

// TestRunReturnsWhenItsContextEndsThoughAChildHoldsItsOutput: an iptables tool
// that is a wrapper (a shell script that runs the binary as its child, not with
// exec) and hangs is killed when the context ends, but its child keeps the
// output pipe open; run still returns within RunWaitDelay of the end, with an
// error, rather than waiting for the child (the plugin's ADD would outlive the
// runtime's timeout and leak). The same in a pod's user namespace.
func TestRunReturnsWhenItsContextEndsThoughAChildHoldsItsOutput(t *testing.T) {
	for _, way := range runWays {
		t.Run(way.name, func(t *testing.T) {
			b, err := NewBackend(Config{LockDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			way.run(t, func(u userNS) {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				start := time.Now()
				// The child outlives the test's bound below, then exits by itself.
				_, err := b.run(ctx, u, "/bin/sh", "", "-c", "sleep 10 & wait")
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a tool killed at its context's end: %v, want an error saying the context ended", err)
				}
				if took := time.Since(start); took > 100*time.Millisecond+RunWaitDelay+time.Second {
					t.Errorf("run took %v, want at most the context's 100ms and RunWaitDelay (%v)", took, RunWaitDelay)
				}
			})
		})
	}
}

// TestRunThatCannotJoinThePodsUserNamespaceSaysWhyAndNamesNativeNftables: when
// the tool cannot join the pod's user namespace (a policy on the node forbids
// it; here the descriptor given is a network namespace, which setns refuses),
// the error names the step, the kernel's error, and the backend that needs no
// user namespace.
func TestRunThatCannotJoinThePodsUserNamespaceSaysWhyAndNamesNativeNftables(t *testing.T) {
	root.Require(t)
	ns := testns.NewInUserNamespace(t)
	b, err := NewBackend(Config{LockDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	notUser, err := os.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer notUser.Close()
	err = netns.Do(ns, func() error {
		_, err := b.run(context.Background(), userNS(notUser.Fd()), "/bin/true", "")
		return err
	})
	for _, want := range []string{"true: fork/exec /bin/true: join the user namespace (setns): invalid argument (", "hostUsers: false", "native_nftables: true"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a tool that cannot join the pod's user namespace: %v; want it to say %q", err, want)
		}
	}
}
