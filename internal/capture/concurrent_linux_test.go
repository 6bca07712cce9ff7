package capture_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/poll"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestAnApplyBesideAFailingOneKeepsItsRules: an nftables apply (the agent's
// repair in place, a retried ADD) runs while another apply into the same
// namespace has written its rules, failed at its routing (IPv6's passthrough
// address, refused: the pod's IPv6 is off) and is rolling them back. It
// succeeds, and its capture is whole afterwards: it waited for the failing
// apply's rollback, which put back what that apply had found (nothing) before
// the second apply wrote. Without the namespace's apply lock it wrote in the
// meantime and reported its capture done, and the rollback then deleted its
// tables: a pod with no capture whose apply had succeeded.
func TestAnApplyBesideAFailingOneKeepsItsRules(t *testing.T) {
	root.Require(t)
	failing := specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"}).Plan(t) // ::6 on lo, refused
	plan := specs.Sidecar().Plan(t)                                                     // IPv4 REDIRECT: no routing
	for name, other := range besideBackends() {
		t.Run(name, func(t *testing.T) {
			ns := ipv6OffNamespace(t)
			wantApplyBesideARollback(t, ns, failing, "add ::6/128 to lo", other(), plan)
		})
	}
}

// TestAnApplyBesideAFailingOneKeepsItsRouting: a pod's rules are in place and
// its TPROXY routing is not (the policy rule and table 133's route removed: the
// agent repairs the pod in place). The repair's apply runs while another apply
// into the same namespace (a retried ADD with a dual-stack plan) has written its
// rules, added IPv4's policy rule and route, failed at IPv6's route (the pod's
// IPv6 is off) and is rolling back: the rules it found, the routing it added.
// The repair succeeds and its capture is whole afterwards, routing included: it
// waited, then found no routing and added it. Without the namespace's apply lock
// it found the failing apply's rule and route, added none, reported its capture
// done, and the rollback then removed them: its rules stayed (the failing
// apply found the same ones and put them back), its TPROXY routing did not.
func TestAnApplyBesideAFailingOneKeepsItsRouting(t *testing.T) {
	root.Require(t)
	tproxy := specs.Sidecar().With(specs.Settings{redirect.FieldMode: "TPROXY"})
	plan := tproxy.Plan(t)                                                     // IPv4: the rule and route of table 133
	failing := tproxy.With(specs.Settings{redirect.FieldIPv6: "true"}).Plan(t) // IPv6's route refused
	for name, other := range besideBackends() {
		t.Run(name, func(t *testing.T) {
			ns := ipv6OffNamespace(t)
			// The pod's rules, without their routing.
			if err := netns.Do(ns, func() error {
				_, err := other().Apply(context.Background(), plan)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			wantApplyBesideARollback(t, ns, failing, "add local default route to table 133 (family 10)", other(), plan)
		})
	}
}

// besideBackends are the backends of the apply that runs beside a failing one,
// by name.
func besideBackends() map[string]func() capture.Backend {
	return map[string]func() capture.Backend{
		"nftables-netlink": func() capture.Backend { return nftables.NewBackend() },
		"nftables-exec":    func() capture.Backend { return nftables.NewExecBackend() },
	}
}

// ipv6OffNamespace is a new network namespace, lo up, IPv6 off: the IPv6
// routing of a plan is refused there after its rules went in.
func ipv6OffNamespace(t *testing.T) string {
	t.Helper()
	ns, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	testns.Run(t, ns, exec.Command("ip", "link", "set", "lo", "up"))
	testns.Run(t, ns, exec.Command("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"))
	return ns
}

// wantApplyBesideARollback applies failing into ns with the nftables backend
// that writes with nft -f; that apply must fail with refusal (at its routing, after its rules went in). Its rollback's write
// waits (pausedNftRollback) while b applies plan into ns beside it, until b's
// apply has ended or has waited a second. Then b's apply must have succeeded,
// and ns must hold plan's capture whole: the rules and the routing.
func wantApplyBesideARollback(t *testing.T, ns string, failing *redirect.Plan, refusal string, b capture.Backend, plan *redirect.Plan) {
	t.Helper()
	rollback := pausedNftRollback(t)
	failed := make(chan error, 1)
	go func() {
		_, err := capture.Apply(context.Background(), ns, nftables.NewExecBackend(), failing)
		failed <- err
	}()
	rollback.waitStarted(t)
	done := make(chan error, 1)
	go func() {
		_, err := capture.Apply(context.Background(), ns, b, plan)
		done <- err
	}()
	var err error
	applied := false
	select {
	case err = <-done:
		applied = true
	case <-time.After(time.Second):
	}
	rollback.release(t)
	if ferr := <-failed; ferr == nil || !strings.Contains(ferr.Error(), refusal) {
		t.Fatalf("the failing apply: %v; want it refused (%s)", ferr, refusal)
	}
	if !applied {
		err = <-done
	}
	if err != nil {
		t.Fatalf("the apply beside the failing one: %v", err)
	}
	if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
		t.Errorf("after the failing apply's rollback, Verify of the apply beside it, which succeeded: %q, %v; want its capture whole", diffs, err)
	}
}

// nftPause is an nft first in PATH that pauses one of its writes
// (pausedNftWrite).
type nftPause struct{ dir string }

// pausedNftRollback pauses the rollback's write of an apply through
// nftables.NewExecBackend (its second `nft -f`, the first being its apply's)
// before it runs: the time between a failed apply's write and its rollback,
// where another apply could come, is as long as the test needs.
func pausedNftRollback(t *testing.T) *nftPause {
	t.Helper()
	return pausedNftWrite(t, 2, false)
}

// pausedNftWrite puts an nft first in PATH whose nth `nft -f` (a write of
// nftables.NewExecBackend: an apply's, a rollback's, a removal's) says it has
// started, then waits for release, before it runs the node's nft or, with
// after, once it has run it (its exit status kept): an apply paused so holds
// its rules and not yet its routing, a removal holds no rules and still the
// routing.
func pausedNftWrite(t *testing.T, n int, after bool) *nftPause {
	t.Helper()
	real, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("nft not installed: %v", err)
	}
	r := &nftPause{dir: t.TempDir()}
	bin := t.TempDir()
	pause := "  if [ $n -eq " + strconv.Itoa(n) + " ]; then\n" +
		"    : >" + r.dir + "/started\n" +
		"    i=0; while [ ! -e " + r.dir + "/go ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done\n" +
		"  fi\n"
	run := "exec " + real + " \"$@\"\n"
	if after {
		run = real + " \"$@\"; rc=$?\n" +
			"if [ \"$1\" = -f ]; then\n" + pause + "fi\n" +
			"exit $rc\n"
		pause = ""
	}
	script := "#!/bin/sh\n" +
		"if [ \"$1\" = -f ]; then\n" +
		"  n=$(($(cat " + r.dir + "/writes 2>/dev/null || echo 0) + 1)); echo $n >" + r.dir + "/writes\n" +
		pause +
		"fi\n" +
		run
	if err := os.WriteFile(filepath.Join(bin, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return r
}

// waitStarted waits until the paused write has started (and pauses).
func (r *nftPause) waitStarted(t *testing.T) {
	t.Helper()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, "the paused nft write has started", func() bool {
		_, err := os.Stat(filepath.Join(r.dir, "started"))
		return !errors.Is(err, os.ErrNotExist)
	})
}

// release lets the paused write go on.
func (r *nftPause) release(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
