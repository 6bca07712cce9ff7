package capture

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// Backend programs plans into the network namespace of the calling thread. Callers
// enter the namespace first (netns.Do); backends never decide anything, they only
// translate the plan.
type Backend interface {
	// Name is "iptables" or "nftables".
	Name() string
	// Apply makes the namespace hold exactly the plan's rules (and none of ours that
	// the plan lacks): one restore per family, which commits table by table, or one
	// nftables transaction for all. It reports whether anything changed: applying
	// the same plan twice changes nothing the second time. With an error, changed
	// says whether it may have written anything before it failed (a restore that
	// failed at a later table keeps the earlier ones): capture.Apply rolls the
	// rules back only then.
	Apply(ctx context.Context, plan *redirect.Plan) (changed bool, err error)
	// Verify reads the live rules back and lists, in words, every difference from
	// the plan. No differences means the capture is in place.
	Verify(ctx context.Context, plan *redirect.Plan) ([]string, error)
	// Cleanup removes everything the backend ever added, and nothing else.
	Cleanup(ctx context.Context) error
}

// rollbackApplier is a Backend whose apply says how to undo it (both backends
// are): rollback puts the namespace's rules back as the apply found them before
// it wrote, the capture of an earlier apply to the same pod included, or removes
// ours when it found none; release lets go of the namespace's apply lock
// (applylock), which the apply keeps until its caller's routing and rollback are
// done: a rollback run after the lock was let go could undo what a concurrent
// apply wrote and reported done, and routing this apply added and then removes
// could be what a concurrent apply found in place and relies on.
type rollbackApplier interface {
	ApplyWithRollback(ctx context.Context, plan *redirect.Plan) (changed bool, rollback func(context.Context) error, release func(), err error)
}

// applyRules is b's apply, with its rollback and release (rollbackApplier). A
// backend without them (none that writes) rolls back with Cleanup, which removes
// every rule of ours.
func applyRules(ctx context.Context, b Backend, plan *redirect.Plan) (changed bool, rollback func(context.Context) error, release func(), err error) {
	if rb, ok := b.(rollbackApplier); ok {
		return rb.ApplyWithRollback(ctx, plan)
	}
	changed, err = b.Apply(ctx, plan)
	return changed, b.Cleanup, func() {}, err
}

// Apply programs plan into the namespace at nsPath: the rules, then the routing
// (TPROXY's policy routing, IPv6's passthrough address). If anything fails, the
// namespace is put back as this apply found it: a namespace is never left
// half-captured, and what was there before it started (the capture of an earlier
// apply to the same pod, or of one running beside it: the agent's repair in
// place during the runtime's ADD, a retried ADD, istio-iptables run twice)
// stays, which that apply reported done. The rules are rolled back only when
// this apply wrote some (Backend.Apply's changed), to the rules it read before it
// wrote them (rollbackApplier: ours removed where there were none), and the
// routing entries it added are removed, only those. The routing comes after the
// rules so that an apply that fails writing them (it gave up waiting for the
// namespace's apply lock, its bound ran out, the backend refused its input) has
// touched no routing: an entry it had added and then removed could be one
// another apply found there and relies on, which would report its capture done
// without it. The namespace's apply lock (applylock), which both backends take
// before they read the rules, is held through the routing and the rollback.
func Apply(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan) (changed bool, err error) {
	changed, _, err = apply(ctx, nsPath, b, plan, false)
	return changed, err
}

// ApplyAndVerify is Apply, then Verify, under one hold of the namespace's apply
// lock: diffs are the differences from plan of what this apply left, never of
// what another apply or a removal wrote between the two (a second take would
// let one in), and the verify does not wait for the lock again. istio-iptables
// and the agent's repair in place apply through it. A verify that fails or
// finds differences rolls nothing back: the apply is done, and the caller
// reports them.
func ApplyAndVerify(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan) (changed bool, diffs []string, err error) {
	return apply(ctx, nsPath, b, plan, true)
}

// apply is Apply, and with verify ApplyAndVerify.
func apply(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan, verify bool) (changed bool, diffs []string, err error) {
	timing.Mark(ctx, "before-apply")
	var verr error
	err = netns.DoWithFD(nsPath, func(fd int) error {
		timing.Mark(ctx, "netns-enter")
		ctx := applylock.InNamespace(ctx, fd)
		var aerr error
		var rollback func(context.Context) error
		var release func()
		changed, rollback, release, aerr = applyRules(ctx, b, plan)
		defer release()
		var added routingEntries
		if aerr == nil {
			added, aerr = applyRouting(plan)
			timing.Mark(ctx, "routing")
		}
		if aerr == nil {
			if verify {
				diffs, verr = verifyHere(ctx, b, plan)
			}
			return nil
		}
		// An apply that wrote nothing (it gave up waiting for the namespace's
		// apply lock, or its first write, all or nothing, failed) rolls no
		// rules back: those in the namespace are another apply's, which may
		// hold that lock and report them done.
		var cerr error
		if changed {
			rctx, cancel := rollbackContext(ctx)
			defer cancel()
			cerr = rollback(rctx)
		}
		_, _, rerr := removeRouting(plan, added)
		return errors.Join(aerr, cerr, rerr)
	})
	timing.Mark(ctx, "netns-exit")
	if err != nil {
		return false, nil, fmt.Errorf("apply %s capture in %s: %w", b.Name(), nsPath, err)
	}
	if verr != nil {
		return changed, nil, fmt.Errorf("verify %s capture in %s: %w", b.Name(), nsPath, verr)
	}
	return changed, diffs, nil
}

// RollbackBound bounds the rollback of a failed apply (its rules put back as it
// found them, the routing it added removed). It is a bound of its own, not what
// is left of the caller's: an apply that failed because that bound ran out (a
// restore killed mid-way, after another family's rules were written) leaves no
// time in it, and a rollback under it would be refused at once, leaving those
// rules in place.
const RollbackBound = 10 * time.Second

// rollbackContext is ctx's values (the recorder, the native fallbacks' list)
// without its deadline or cancellation, bounded by RollbackBound.
func rollbackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RollbackBound)
}

// Verify compares the namespace's live rules and routing with the plan. It
// holds the namespace's apply lock, shared (applylock.TakeShared), while it
// reads: an apply is several steps (one family's rules, the other's, the
// routing, a rollback), and a read between two of them would report
// differences that the apply's end removes, or, in TPROXY mode, rules without
// their routing. It waits for an apply or a removal in progress, within
// applylock.WaitBound and ctx, and fails with its applylock.HeldError, naming
// the holder, rather than report what it read meanwhile.
func Verify(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan) ([]string, error) {
	var diffs []string
	err := locked(ctx, nsPath, applylock.TakeShared, func() (err error) {
		diffs, err = verifyHere(ctx, b, plan)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("verify %s capture in %s: %w", b.Name(), nsPath, err)
	}
	return diffs, nil
}

// Read runs fn in the network namespace at nsPath holding the namespace's apply
// lock shared, as Verify does, for a reader that reads more than one thing and
// shows them together (the doctor: the live rules it prints, their differences
// from the pod's plan, the other backend's stray rules): read under one hold,
// they are of one moment, with no apply's step or removal between them; read
// apart, the rules printed could be an apply's half while the differences were
// read after its end. fn runs in the namespace (a process it starts is in it
// too); verify is Verify there, under the same hold, with Verify's errors. fn
// must not take the lock itself (see locked). fn's error is returned as it is;
// entering the namespace or taking the lock fails naming nsPath, with the
// lock's applylock.HeldError.
func Read(ctx context.Context, nsPath string, fn func(verify func(b Backend, plan *redirect.Plan) ([]string, error)) error) error {
	var ferr error
	err := locked(ctx, nsPath, applylock.TakeShared, func() error {
		ferr = fn(func(b Backend, plan *redirect.Plan) ([]string, error) {
			diffs, err := verifyHere(ctx, b, plan)
			if err != nil {
				return nil, fmt.Errorf("verify %s capture in %s: %w", b.Name(), nsPath, err)
			}
			return diffs, nil
		})
		return ferr
	})
	if ferr != nil && errors.Is(err, ferr) {
		return err
	}
	if err != nil {
		return fmt.Errorf("read capture in %s: %w", nsPath, err)
	}
	return nil
}

// verifyHere is Verify in the calling thread's namespace, its lock held: the
// routing's differences, then the rules'.
func verifyHere(ctx context.Context, b Backend, plan *redirect.Plan) ([]string, error) {
	rd, err := verifyRouting(plan)
	if err != nil {
		return nil, err
	}
	bd, err := b.Verify(ctx, plan)
	if err != nil {
		return nil, err
	}
	return append(rd, bd...), nil
}

// locked runs fn in the network namespace at nsPath, holding the namespace's
// apply lock as take takes it (applylock.Take to remove the capture,
// applylock.TakeShared to read it) through the descriptor netns.DoWithFD
// opened: no second open, and so no more than the two flock calls. fn is given
// no part of the lock: what it calls must not take it again (a second
// descriptor's flock would wait for this one, held by the same process, until
// the bound ran out).
func locked(ctx context.Context, nsPath string, take func(context.Context) (func(), error), fn func() error) error {
	return netns.DoWithFD(nsPath, func(fd int) error {
		timing.Mark(ctx, "netns-enter")
		release, err := take(applylock.InNamespace(ctx, fd))
		if err != nil {
			return err
		}
		defer release()
		timing.Mark(ctx, "apply-lock")
		return fn()
	})
}

// chainReader is a Backend that reads its live chains back (both backends are).
type chainReader interface {
	Chains(ctx context.Context) ([]redirect.LiveChain, error)
}

// Check judges the capture in the namespace at nsPath as the plugin's CHECK does.
// want is the plan the pod's settings ask for now, nil when they ask for none or
// cannot be read. broken lists, in words, what shows the capture missing or cut:
// with want, any difference when the live rules are want's (the routing they
// need), or no rules of ours at all; with or without, a chain cut off or emptied
// (redirect.CutOff). differ lists the other differences from want, which a
// change since the ADD explains as well as a fault (an annotation edited, the
// plugin upgraded: the ADD's rules stay until the pod is recreated).
func Check(ctx context.Context, nsPath string, b Backend, want *redirect.Plan) (broken, differ []string, err error) {
	err = locked(ctx, nsPath, applylock.TakeShared, func() error {
		if want != nil {
			rd, err := verifyRouting(want)
			if err != nil {
				return err
			}
			bd, err := b.Verify(ctx, want)
			if err != nil {
				return err
			}
			if len(bd) == 0 {
				// The rules are want's: so is the routing they need.
				broken = rd
				return nil
			}
			differ = append(rd, bd...)
		}
		cr, ok := b.(chainReader)
		if !ok {
			broken, differ = differ, nil
			return nil
		}
		chains, err := cr.Chains(ctx)
		if err != nil {
			return err
		}
		broken = redirect.CutOff(chains)
		if len(chains) == 0 && want != nil && len(want.Families) > 0 {
			broken = append(broken, "none of the capture's rules is in the namespace")
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("check %s capture in %s: %w", b.Name(), nsPath, err)
	}
	return broken, differ, nil
}

// Cleanup removes the capture's rules and routing from the namespace at nsPath,
// whichever apply added them (the plugin's DEL, istio-iptables' cleanup), and
// says which routing entries it removed (see removeRouting). plan may be nil;
// routing is then removed for the default mark and table. The rules and the
// routing are each a phase of ctx's recorder (cleanup-rules, cleanup-routing).
// It holds the namespace's apply lock (applylock.Take) through both: it waits
// for an apply in progress, within applylock.WaitBound and ctx, then removes
// what that apply left, and an apply waits for it; run during an apply it
// removed rules that the apply then reported done, or left the routing the
// apply added after it without its rules.
func Cleanup(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan) (removedRouting []string, err error) {
	removedRouting, _, err = cleanup(ctx, nsPath, b, plan)
	return removedRouting, err
}

// cleanup is Cleanup, and also counts the routing deletions it tried (see
// removeRouting).
func cleanup(ctx context.Context, nsPath string, b Backend, plan *redirect.Plan) (removedRouting []string, routingTried int, err error) {
	if plan == nil {
		plan = &redirect.Plan{Routing: &redirect.Routing{Mark: redirect.DefaultTProxyMark, Table: redirect.DefaultTProxyRouteTable},
			IPv6InboundPassthroughAddr: redirect.InboundPassthroughV6}
	}
	timing.Mark(ctx, "before-cleanup")
	err = locked(ctx, nsPath, applylock.Take, func() error {
		cerr := b.Cleanup(ctx)
		timing.Mark(ctx, "cleanup-rules")
		var rerr error
		removedRouting, routingTried, rerr = removeRouting(plan, allRouting)
		timing.Mark(ctx, "cleanup-routing")
		return errors.Join(cerr, rerr)
	})
	timing.Mark(ctx, "netns-exit")
	if err != nil {
		return removedRouting, routingTried, fmt.Errorf("clean up %s capture in %s: %w", b.Name(), nsPath, err)
	}
	return removedRouting, routingTried, nil
}
