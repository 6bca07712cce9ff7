package capture_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// waitsFor is how long a call that must wait for the namespace's apply lock is
// watched not to return: one that does not wait returns in milliseconds.
const waitsFor = 300 * time.Millisecond

// mustWait watches ch for waitsFor: what it yields meanwhile fails t, as a call
// (what) that did not wait. later gives what it yields, whenever it does.
func mustWait[T any](t *testing.T, what string, ch <-chan T) (later func() T) {
	t.Helper()
	select {
	case v := <-ch:
		t.Errorf("%s returned at once (%v); want it to wait", what, v)
		return func() T { return v }
	case <-time.After(waitsFor):
		return func() T { return <-ch }
	}
}

// secondWaitsForFirst runs first, whose nft write (through the nft binary:
// pausedNftWrite) pauses after it is done, and once it has paused, second, which
// must wait for first's hold of the namespace's lock (mustWait; what names it);
// then lets first go on and returns both errors.
func secondWaitsForFirst(t *testing.T, what string, first, second func() error) (firstErr, secondErr error) {
	t.Helper()
	paused := pausedNftWrite(t, 1, true)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first() }()
	paused.waitStarted(t)
	secondDone := make(chan error, 1)
	go func() { secondDone <- second() }()
	later := mustWait(t, what, secondDone)
	paused.release(t)
	return <-firstDone, later()
}

// tproxyPlan is a TPROXY capture: rules, then the policy routing they need.
func tproxyPlan(t *testing.T) *redirect.Plan {
	t.Helper()
	return specs.Sidecar().With(specs.Settings{redirect.FieldMode: "TPROXY"}).Plan(t)
}

// wantHeld fails t unless err is the applylock.HeldError of a wait for the lock
// of the namespace at ns, held by this process, that ended with the caller's
// bound, wrapped in what names the namespace's path.
func wantHeld(t *testing.T, what string, err error, ns string) {
	t.Helper()
	var he *applylock.HeldError
	if !errors.As(err, &he) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: %v; want a HeldError wrapping the deadline", what, err)
	}
	id, ierr := netns.ID(ns)
	if ierr != nil {
		t.Fatal(ierr)
	}
	comm, cerr := os.ReadFile("/proc/self/comm")
	if cerr != nil {
		t.Fatal(cerr)
	}
	for _, want := range []string{
		fmt.Sprintf(" capture in %s: network namespace net:[%d]: gave up after ", ns, id),
		"(the caller's bound) waiting for its apply lock, ",
		fmt.Sprintf("held by pid %d (%s): ", os.Getpid(), strings.TrimSpace(string(comm))),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s's error:\n%v\nwant it to say %q", what, err, want)
		}
	}
}

// TestAReadWaitsForTheApplyInProgress: a TPROXY apply has written its rules
// and not yet its routing (its nft write paused). A read of the namespace's
// capture then, Verify (the agent's, istio-iptables'), Read (the doctor's) or
// Check (the plugin's CHECK), waits for the apply: with a short bound it fails, its
// error the namespace's applylock.HeldError naming the apply's process, and
// not a difference; without one it returns once the apply is done, with no
// difference. Before, it took no lock and reported the routing missing: a
// CHECK that failed a healthy pod, a repair that applied again.
func TestAReadWaitsForTheApplyInProgress(t *testing.T) {
	root.Require(t)
	plan := tproxyPlan(t)
	reads := []struct {
		name string
		read func(ctx context.Context, ns string) ([]string, error)
	}{
		{"Verify", func(ctx context.Context, ns string) ([]string, error) {
			return capture.Verify(ctx, ns, nftables.NewBackend(), plan)
		}},
		{"Check", func(ctx context.Context, ns string) ([]string, error) {
			broken, differ, err := capture.Check(ctx, ns, nftables.NewBackend(), plan)
			return append(broken, differ...), err
		}},
		{"Read", func(ctx context.Context, ns string) (diffs []string, err error) {
			err = capture.Read(ctx, ns, func(verify func(capture.Backend, *redirect.Plan) ([]string, error)) (err error) {
				diffs, err = verify(nftables.NewBackend(), plan)
				return err
			})
			return diffs, err
		}},
	}
	for _, r := range reads {
		t.Run(r.name, func(t *testing.T) {
			ns := ipv6OffNamespace(t)
			paused := pausedNftWrite(t, 1, true)
			applied := make(chan error, 1)
			go func() {
				_, err := capture.Apply(context.Background(), ns, nftables.NewExecBackend(), plan)
				applied <- err
			}()
			paused.waitStarted(t)

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			diffs, err := r.read(ctx, ns)
			cancel()
			if err == nil {
				paused.release(t)
				t.Fatalf("%s during the apply, with a short bound: differences %q; want it to wait and give up", r.name, diffs)
			}
			wantHeld(t, r.name+" during the apply, with a short bound", err, ns)

			type result struct {
				diffs []string
				err   error
			}
			read := make(chan result, 1)
			go func() {
				diffs, err := r.read(context.Background(), ns)
				read <- result{diffs, err}
			}()
			readLater := mustWait(t, r.name+" during the apply", read)
			paused.release(t)
			if err := <-applied; err != nil {
				t.Fatalf("the apply: %v", err)
			}
			if got := readLater(); got.err != nil || len(got.diffs) > 0 {
				t.Errorf("%s started during the apply: %q, %v; want no differences once it is done", r.name, got.diffs, got.err)
			}
		})
	}
}

// TestARemovalAndAnApplyWaitForEachOther: a removal of a pod's capture (the
// plugin's DEL, istio-iptables' clean) waits for an apply in progress into
// the namespace (its rules written, its TPROXY routing not yet), and then
// removes everything: no rules and no routing are left. An apply into a
// namespace whose capture is being removed (its rules gone, its routing not
// yet) waits for the removal, and then its capture is whole: it does not find
// the routing in place, report its capture done, and see the removal take the
// routing away. Before, the removal took no lock: the first left the apply's
// routing without its rules, the second the apply's rules without their
// routing, an apply that had reported itself done.
func TestARemovalAndAnApplyWaitForEachOther(t *testing.T) {
	root.Require(t)
	plan := tproxyPlan(t)
	t.Run("a removal during an apply", func(t *testing.T) {
		ns := ipv6OffNamespace(t)
		before := liveRouting(t, ns)
		applyErr, removeErr := secondWaitsForFirst(t, "the removal during the apply",
			func() error {
				_, err := capture.Apply(context.Background(), ns, nftables.NewExecBackend(), plan)
				return err
			},
			func() error {
				_, err := capture.Cleanup(context.Background(), ns, nftables.NewBackend(), nil)
				return err
			})
		if applyErr != nil || removeErr != nil {
			t.Fatalf("the apply: %v; the removal: %v", applyErr, removeErr)
		}
		if diffs, err := capture.Verify(context.Background(), ns, nftables.NewBackend(), &redirect.Plan{}); err != nil || len(diffs) > 0 {
			t.Errorf("after the removal, the rules left: %q, %v; want none", diffs, err)
		}
		if got := liveRouting(t, ns); got != before {
			t.Errorf("after the removal, the routing:\n%s\nwant it as before the apply:\n%s", got, before)
		}
	})
	t.Run("an apply during a removal", func(t *testing.T) {
		ns := ipv6OffNamespace(t)
		if _, err := capture.Apply(context.Background(), ns, nftables.NewBackend(), plan); err != nil {
			t.Fatal(err)
		}
		removeErr, applyErr := secondWaitsForFirst(t, "the apply during the removal",
			func() error {
				_, err := capture.Cleanup(context.Background(), ns, nftables.NewExecBackend(), nil)
				return err
			},
			func() error {
				_, err := capture.Apply(context.Background(), ns, nftables.NewBackend(), plan)
				return err
			})
		if removeErr != nil || applyErr != nil {
			t.Fatalf("the removal: %v; the apply: %v", removeErr, applyErr)
		}
		if diffs, err := capture.Verify(context.Background(), ns, nftables.NewBackend(), plan); err != nil || len(diffs) > 0 {
			t.Errorf("after the removal and the apply that waited for it: %q, %v; want the apply's capture whole", diffs, err)
		}
	})
}

// TestTheReadsShareTheLockTheRemovalsDoNot: with every backend, while another
// process's apply holds the namespace's apply lock (here the test, through
// applylock.Take, as the agent's repair in place takes it), Verify, Check and
// Cleanup each wait, and with a short bound fail with its HeldError naming the
// holder; while a reader holds it shared (applylock.TakeShared), Verify and
// Check go at once (two CHECKs, or a CHECK and the doctor, never wait for each
// other) and Cleanup waits. Once let go, each goes through.
func TestTheReadsShareTheLockTheRemovalsDoNot(t *testing.T) {
	root.Require(t)
	plan := tproxyPlan(t)
	for name, mk := range backendFactories {
		t.Run(name, func(t *testing.T) {
			b, err := mk(t)
			if err != nil {
				t.Fatal(err)
			}
			ns := ipv6OffNamespace(t)
			if _, err := capture.Apply(context.Background(), ns, b, plan); err != nil {
				t.Fatal(err)
			}
			calls := []struct {
				name  string
				reads bool
				call  func(ctx context.Context) error
			}{ // Cleanup last: the calls run in this order once the lock is let go
				{name: "Verify", reads: true, call: func(ctx context.Context) error {
					diffs, err := capture.Verify(ctx, ns, b, plan)
					if err == nil && len(diffs) > 0 {
						return fmt.Errorf("differences %q", diffs)
					}
					return err
				}},
				{name: "Check", reads: true, call: func(ctx context.Context) error {
					broken, differ, err := capture.Check(ctx, ns, b, plan)
					if err == nil && len(broken)+len(differ) > 0 {
						return fmt.Errorf("differences %q %q", broken, differ)
					}
					return err
				}},
				{name: "Read", reads: true, call: func(ctx context.Context) error {
					// Two verifies under the one hold, as the doctor's: the second
					// does not wait for the first's lock.
					return capture.Read(ctx, ns, func(verify func(capture.Backend, *redirect.Plan) ([]string, error)) error {
						for range 2 {
							diffs, err := verify(b, plan)
							if err != nil {
								return err
							}
							if len(diffs) > 0 {
								return fmt.Errorf("differences %q", diffs)
							}
						}
						return nil
					})
				}},
				{name: "Cleanup", call: func(ctx context.Context) error {
					_, err := capture.Cleanup(ctx, ns, b, nil)
					return err
				}},
			}
			for _, holder := range []struct {
				name string
				take func(context.Context) (func(), error)
			}{{"an apply", applylock.Take}, {"a reader", applylock.TakeShared}} {
				var release func()
				if err := netns.Do(ns, func() (err error) {
					release, err = holder.take(context.Background())
					return err
				}); err != nil {
					t.Fatal(err)
				}
				for _, c := range calls {
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					err := c.call(ctx)
					cancel()
					if c.reads && holder.name == "a reader" {
						if err != nil {
							t.Errorf("%s while %s holds the lock: %v; want it to go at once", c.name, holder.name, err)
						}
						continue
					}
					wantHeld(t, c.name+" while "+holder.name+" holds the lock, with a short bound", err, ns)
				}
				release()
			}
			for _, c := range calls {
				if err := c.call(context.Background()); err != nil {
					t.Errorf("%s once the lock is let go: %v", c.name, err)
				}
			}
		})
	}
}

// TestApplyAndVerifyVerifiesUnderTheApplysHold: ApplyAndVerify (istio-iptables,
// the agent's repair in place) verifies under its apply's hold of the
// namespace's apply lock, with every backend: it returns at once, the capture
// changed and no difference, where a verify that took the lock again, through
// another descriptor of the namespace, would wait for its own process's hold
// until applylock.WaitBound ran out; and a removal started during the apply
// (its nft write paused) waits for the verify as well as the apply.
func TestApplyAndVerifyVerifiesUnderTheApplysHold(t *testing.T) {
	root.Require(t)
	plan := tproxyPlan(t)
	for name, mk := range backendFactories {
		t.Run(name, func(t *testing.T) {
			b, err := mk(t)
			if err != nil {
				t.Fatal(err)
			}
			ns := ipv6OffNamespace(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			changed, diffs, err := capture.ApplyAndVerify(ctx, ns, b, plan)
			if err != nil || !changed || len(diffs) > 0 {
				t.Fatalf("ApplyAndVerify into a new namespace: changed %v, differences %q, %v; want changed, none", changed, diffs, err)
			}
			changed, diffs, err = capture.ApplyAndVerify(ctx, ns, b, plan)
			if err != nil || changed || len(diffs) > 0 {
				t.Fatalf("ApplyAndVerify again: changed %v, differences %q, %v; want unchanged, none", changed, diffs, err)
			}
		})
	}
	t.Run("a removal during it", func(t *testing.T) {
		ns := ipv6OffNamespace(t)
		paused := pausedNftWrite(t, 1, true)
		type result struct {
			diffs []string
			err   error
		}
		applied := make(chan result, 1)
		go func() {
			_, diffs, err := capture.ApplyAndVerify(context.Background(), ns, nftables.NewExecBackend(), plan)
			applied <- result{diffs, err}
		}()
		paused.waitStarted(t)
		removed := make(chan error, 1)
		go func() {
			_, err := capture.Cleanup(context.Background(), ns, nftables.NewBackend(), nil)
			removed <- err
		}()
		removedLater := mustWait(t, "the removal during ApplyAndVerify", removed)
		paused.release(t)
		if got := <-applied; got.err != nil || len(got.diffs) > 0 {
			t.Errorf("ApplyAndVerify with a removal waiting: differences %q, %v; want none: the removal comes after its verify", got.diffs, got.err)
		}
		if err := removedLater(); err != nil {
			t.Fatalf("the removal: %v", err)
		}
	})
}
