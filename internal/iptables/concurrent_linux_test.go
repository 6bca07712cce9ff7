package iptables

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// savedInBoth is what iptables-save and ip6tables-save of the mode print in ns,
// without dates and counters.
func savedInBoth(t *testing.T, ns string, m Mode) string {
	t.Helper()
	return rulestext.Saved(runIn(t, ns, "iptables-"+string(m)+"-save")) + rulestext.Saved(runIn(t, ns, "ip6tables-"+string(m)+"-save"))
}

// TestConcurrentAppliesToOneNamespace: two applies of one plan into one new
// namespace at once (the repair controller's in-place repair during the
// plugin's ADD; a runtime's retried ADD beside the first) both succeed and leave
// exactly what one apply leaves: no rule twice, and no rollback of one removing
// what the other wrote. Both backends share the lock directory, as the plugin
// and the agent do (the agent's run dir). Native writes (nft mode, the default
// sidecar), restores in nft mode (TPROXY, which the native writer leaves to the
// restore) and legacy restores are all raced.
func TestConcurrentAppliesToOneNamespace(t *testing.T) {
	root.Require(t)
	for _, m := range modes(t) {
		for _, tc := range backendCases[:2] {
			t.Run(string(m)+"/"+tc.name, func(t *testing.T) {
				plan := tc.opts.Plan(t)
				dir := t.TempDir()
				mk := func() *Backend { return lockingBackend(t, m, dir) }
				one := newNS(t)
				if _, err := capture.Apply(context.Background(), one, mk(), plan); err != nil {
					t.Fatal(err)
				}
				want := savedInBoth(t, one, m)
				for round := range 8 {
					ns := newNS(t)
					var wg sync.WaitGroup
					errs := make([]error, 2)
					start := make(chan struct{})
					for i := range errs {
						b := mk()
						wg.Go(func() {
							<-start
							_, errs[i] = capture.Apply(context.Background(), ns, b, plan)
						})
					}
					close(start)
					wg.Wait()
					if err := errors.Join(errs...); err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					if got := savedInBoth(t, ns, m); got != want {
						t.Fatalf("round %d: after two applies at once the namespace holds:\n%s\nwant what one apply leaves:\n%s", round, got, want)
					}
				}
			})
		}
	}
}

// TestNativeWriteMeetsTablesWrittenSinceTheProbe: when an apply that takes no
// apply lock (one of a build before the native write took it, during an
// upgrade) writes the family's tables between this apply's look (no table) and
// its native write, the write's exclusive table creation is refused whole, and
// the apply reads what is there and finds the plan in place: no rule is added
// twice, and nothing is reported refused.
func TestNativeWriteMeetsTablesWrittenSinceTheProbe(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	b, err := NewBackend(Config{Mode: ModeNFT, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !b.NativeWrites() {
		t.Fatal("this node's iptables-nft is not written natively: the test needs the native write (iptables-nft with nft_compat)")
	}
	plan := specs.Sidecar().Plan(t)
	var raced, refusedByKernel []error
	b.writeNative = func(objs []nativeObjects) error {
		// The other apply's native write, of the same plan, between this
		// one's probe and its write.
		if err := writeNative(objs); err != nil {
			return err
		}
		err := writeNative(objs)
		raced = append(raced, err)
		return err
	}
	ns := newNS(t)
	var changed bool
	if err := netns.Do(ns, func() error {
		var err error
		changed, err = b.Apply(WithNativeFallbacks(context.Background(), &refusedByKernel), plan)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(raced) == 0 || !errors.Is(raced[0], unix.EEXIST) {
		t.Errorf("the native write over the other apply's tables returned %v, want EEXIST", raced)
	}
	if changed || len(refusedByKernel) > 0 {
		t.Errorf("changed %v, refusals reported %v: want the plan found in place", changed, refusedByKernel)
	}
	one := newNS(t)
	if _, err := capture.Apply(context.Background(), one, lockingBackend(t, ModeNFT, dir), plan); err != nil {
		t.Fatal(err)
	}
	if got, want := savedInBoth(t, ns, ModeNFT), savedInBoth(t, one, ModeNFT); got != want {
		t.Errorf("the namespace holds:\n%s\nwant what one apply leaves:\n%s", got, want)
	}
}

// TestANativeApplyBesideAFailingOneKeepsItsRules: in nft mode a pod's new
// namespace is written natively. That apply fails after its write (IPv6's
// passthrough address is refused: the pod's IPv6 is off) and, between its
// write and its rollback, another apply into the namespace (the agent's repair
// in place, a retried ADD: here with an IPv4-only plan) runs. That apply
// succeeds, and its rules are whole afterwards: it waited for the failing
// apply's rollback, which put back what that apply had found (nothing of ours).
// The native write took no lock, so the other apply wrote and reported done
// meanwhile, and the rollback then removed its rules.
func TestANativeApplyBesideAFailingOneKeepsItsRules(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	failing := lockingBackend(t, ModeNFT, dir)
	if !failing.NativeWrites() {
		t.Fatal("this node's iptables-nft is not written natively: the test needs the native write (iptables-nft with nft_compat)")
	}
	other := lockingBackend(t, ModeNFT, dir)
	plan := specs.Sidecar().Plan(t)
	ns := newNS(t)
	runIn(t, ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
	done := make(chan error, 1)
	applied := false
	var beside error
	writes := 0
	failing.writeNative = func(objs []nativeObjects) error {
		if err := writeNative(objs); err != nil {
			return err
		}
		if writes++; writes == 2 { // IPv6's, the last: the other apply, before the routing and the rollback
			go func() {
				_, err := capture.Apply(context.Background(), ns, other, plan)
				done <- err
			}()
			select {
			case beside = <-done:
				applied = true
			case <-time.After(time.Second):
			}
		}
		return nil
	}
	dual := specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"}).Plan(t)
	if _, err := capture.Apply(context.Background(), ns, failing, dual); err == nil || !strings.Contains(err.Error(), "add ::6/128 to lo") {
		t.Fatalf("the failing apply: %v; want IPv6's passthrough address refused", err)
	}
	if writes != 2 {
		t.Fatalf("the failing apply wrote %d families natively, want both", writes)
	}
	if !applied {
		beside = <-done
	}
	if beside != nil {
		t.Fatalf("the apply beside the failing one: %v", beside)
	}
	if diffs, err := capture.Verify(context.Background(), ns, other, plan); err != nil || len(diffs) > 0 {
		t.Errorf("after the failing apply's rollback, Verify of the apply beside it, which succeeded: %q, %v; want its capture whole", diffs, err)
	}
}

// TestApplyWaitsForTheNamespacesApplyLock: an apply that reads and restores
// (legacy mode) waits while another holds the namespace's apply lock, and goes
// on once it is released; the lock is not the xtables lock the restore takes.
func TestApplyWaitsForTheNamespacesApplyLock(t *testing.T) {
	root.Require(t)
	dir := t.TempDir()
	b, err := NewBackend(Config{Mode: ModeLegacy, LockDir: dir})
	if err != nil {
		t.Fatalf("no iptables-legacy: %v", err)
	}
	ns := newNS(t)
	release := holdApplyLock(t, b, ns)
	done := make(chan error, 1)
	go func() {
		_, err := capture.Apply(context.Background(), ns, b, specs.Sidecar().Plan(t))
		done <- err
	}()
	select {
	case err := <-done:
		release()
		t.Fatalf("Apply finished (%v) while another held the namespace's apply lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Apply still waits after the lock was released")
	}
	if !strings.Contains(savedInBoth(t, ns, ModeLegacy), "ISTIO_") {
		t.Error("no rules of ours after the apply")
	}
	// A waiter gives up with its context.
	if err := netns.Do(ns, func() error {
		r, err := b.lockApply(context.Background())
		if err != nil {
			return err
		}
		defer r()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := b.Apply(ctx, specs.Sidecar().Plan(t)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Apply under a held lock and an expiring context: %v, want the deadline", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestAnApplyThatWroteNothingRollsNothingBack: an apply that gives up waiting
// for the namespace's apply lock (its bound ran out while another apply held
// it: the repair controller's in-place repair beside a slow ADD) has written
// nothing, so its failure removes nothing: the capture of the apply that holds
// the lock, which reports it done, stays whole: its rules, TPROXY's policy
// routing and IPv6's passthrough address. Its rollback removed every rule of
// ours in the namespace, without the lock, and later still the routing and the
// address, which it had found there.
func TestAnApplyThatWroteNothingRollsNothingBack(t *testing.T) {
	root.Require(t)
	plan := backendCases[1].opts.Plan(t) // TPROXY, dual stack
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			b := lockingBackend(t, m, t.TempDir())
			ns := newNS(t)
			// The other apply: its capture in place, its lock still held.
			if _, err := capture.Apply(context.Background(), ns, b, plan); err != nil {
				t.Fatal(err)
			}
			want := savedInBoth(t, ns, m)
			release := holdApplyLock(t, b, ns)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if _, err := capture.Apply(ctx, ns, b, plan); !errors.Is(err, context.DeadlineExceeded) {
				release()
				t.Fatalf("Apply while another held the namespace's apply lock: %v, want it stopped by its bound", err)
			}
			if got := savedInBoth(t, ns, m); got != want {
				t.Errorf("after an apply that wrote nothing failed, the namespace holds:\n%s\nwant the other apply's rules:\n%s", got, want)
			}
			release() // the other apply is done: Verify waits for it (capture.Verify holds the lock shared)
			if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
				t.Errorf("after an apply that wrote nothing failed, Verify: %q, %v; want the other apply's capture whole", diffs, err)
			}
		})
	}
}

// TestAnApplyWaitingForTheApplyLockHasAddedNoRouting: an apply that waits for
// the namespace's apply lock, held by another apply, has added no routing yet
// (the routing comes after the rules, under that lock), and when it gives up it
// leaves none: routing it added before the wait could be what another apply
// found there and relies on, which its removal would take away. It added
// TPROXY's routing and IPv6's passthrough address before it waited.
func TestAnApplyWaitingForTheApplyLockHasAddedNoRouting(t *testing.T) {
	root.Require(t)
	plan := backendCases[1].opts.Plan(t) // TPROXY, dual stack
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			b := lockingBackend(t, m, t.TempDir())
			ns := newNS(t)
			release := holdApplyLock(t, b, ns)
			defer release()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := capture.Apply(ctx, ns, b, plan)
				done <- err
			}()
			routing := func() string {
				return runIn(t, ns, "ip", "rule") + runIn(t, ns, "ip", "-6", "rule") + runIn(t, ns, "ip", "-6", "addr", "show", "dev", "lo")
			}
			time.Sleep(300 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("Apply finished (%v) while another held the namespace's apply lock", err)
			default:
			}
			waiting := routing()
			if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Apply while another held the namespace's apply lock: %v, want it stopped by its bound", err)
			}
			for when, out := range map[string]string{"while it waited": waiting, "after it gave up": routing()} {
				for _, ours := range []string{"lookup 133", "::6/128"} {
					if strings.Contains(out, ours) {
						t.Errorf("%s, the apply's namespace shows %q:\n%s", when, ours, out)
					}
				}
			}
		})
	}
}

// holdApplyLock takes the apply lock of the namespace at ns, as another apply
// would hold it, and returns its release.
func holdApplyLock(t *testing.T, b *Backend, ns string) (release func()) {
	t.Helper()
	if err := netns.Do(ns, func() error {
		var err error
		release, err = b.lockApply(context.Background())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return release
}

// lockingBackend is a backend of mode m whose namespaces' lock files and native
// state live in dir (a test's own), as the plugin's live in its run directory.
func lockingBackend(t *testing.T, m Mode, dir string) *Backend {
	t.Helper()
	b, err := NewBackend(Config{Mode: m, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
