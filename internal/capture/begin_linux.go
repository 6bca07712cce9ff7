package capture

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// ApplyFunc writes a plan's rules in the namespace of the calling thread, as
// Backend.Apply does.
type ApplyFunc func(ctx context.Context, plan *redirect.Plan) (changed bool, err error)

// Preparer is a Backend that can read, before the plan is known, what its Apply
// reads of the namespace first (which tables exist, ours among them). Prepare runs
// on a thread in the namespace; the ApplyFunc it returns is Apply given that
// read and runs on the same thread; release frees what the read holds when the
// ApplyFunc is not called. What the namespace gains between the two (nothing, for a
// pod's new namespace) is the backend's to handle, as between its own read and
// write.
type Preparer interface {
	Prepare(ctx context.Context) (apply func(context.Context, *redirect.Plan) (bool, error), release func(), err error)
}

// Pending is a namespace entered ahead of its plan (Begin): Apply writes the plan
// there, Close leaves the namespace unchanged. Close may follow Apply.
type Pending struct {
	nsPath string
	b      Backend
	// ready is closed once the thread is in the namespace and the backend's read
	// is done (or failed), or entering failed.
	ready chan struct{}
	// Set before ready is closed.
	entered    bool
	prepareErr error
	took       time.Duration

	requests chan applyRequest
	quit     chan struct{}
	// done gets netns.Do's error once the thread has left the namespace.
	done      chan error
	closeOnce sync.Once
	applied   bool
}

type applyRequest struct {
	ctx   context.Context
	plan  *redirect.Plan
	reply chan<- applyResult
}

type applyResult struct {
	changed bool
	err     error
}

// Begin enters the namespace at nsPath on a thread of its own and, when b is a
// Preparer, reads what b's apply reads first. It returns at once: the work goes on
// while the caller finds the plan (the plugin's ADD, while it asks the API server
// for the pod). Pending.Apply then applies the plan as Apply does, with the same
// rollback; a namespace that could not be entered is applied by Apply itself, and
// one whose read failed by the backend's own Apply, so Begin changes when the work
// is done, never its outcome. The thread leaves the namespace when ctx ends.
func Begin(ctx context.Context, nsPath string, b Backend) *Pending {
	p := &Pending{nsPath: nsPath, b: b, ready: make(chan struct{}), requests: make(chan applyRequest),
		quit: make(chan struct{}), done: make(chan error, 1)}
	// The read is timed as a whole (Took): its phases would interleave with the
	// caller's in the recorder.
	bg := timing.With(ctx, nil)
	go func() {
		start := time.Now()
		err := netns.Do(nsPath, func() error {
			apply := ApplyFunc(b.Apply)
			release := func() {}
			if pr, ok := b.(Preparer); ok {
				a, r, err := pr.Prepare(bg)
				if err == nil {
					apply, release = a, r
				}
				p.prepareErr = err
			}
			p.entered, p.took = true, time.Since(start)
			close(p.ready)
			select {
			case req := <-p.requests:
				changed, err := applyHere(req.ctx, b, apply, req.plan)
				req.reply <- applyResult{changed, err}
			case <-p.quit:
				release()
			case <-ctx.Done():
				release()
			}
			return nil
		})
		if !p.entered {
			p.took = time.Since(start)
			close(p.ready)
		}
		p.done <- err
	}()
	return p
}

// Ready reports, once the namespace was entered and read, how long that took and
// the backend's read error (nil when it read, or is no Preparer); entered is false
// when the namespace could not be entered (Apply then runs Apply).
func (p *Pending) Ready() (entered bool, took time.Duration, readErr error) {
	<-p.ready
	return p.entered, p.took, p.prepareErr
}

// Apply programs plan into the namespace as Apply does, on the thread Begin put in
// it. It waits for Begin's read first (timed as "prepare-wait").
func (p *Pending) Apply(ctx context.Context, plan *redirect.Plan) (changed bool, err error) {
	timing.Mark(ctx, "before-apply")
	select {
	case <-p.ready:
	case <-ctx.Done():
		return false, fmt.Errorf("apply %s capture in %s: %w", p.b.Name(), p.nsPath, ctx.Err())
	}
	timing.Mark(ctx, "prepare-wait")
	if !p.entered {
		return Apply(ctx, p.nsPath, p.b, plan)
	}
	p.applied = true
	reply := make(chan applyResult, 1)
	var res applyResult
	select {
	case p.requests <- applyRequest{ctx: ctx, plan: plan, reply: reply}:
		res = <-reply
	case <-p.done:
		// The thread left before the request: Begin's ctx ended.
		return false, fmt.Errorf("apply %s capture in %s: the namespace was left before the plan came", p.b.Name(), p.nsPath)
	}
	doErr := <-p.done
	timing.Mark(ctx, "netns-exit")
	if res.err == nil {
		res.err = doErr
	}
	if res.err != nil {
		return false, fmt.Errorf("apply %s capture in %s: %w", p.b.Name(), p.nsPath, res.err)
	}
	return res.changed, nil
}

// Close leaves the namespace without changing it, unless Apply ran, and waits
// until the thread is out.
func (p *Pending) Close() {
	p.closeOnce.Do(func() {
		if p.applied {
			return
		}
		close(p.quit)
		<-p.done
	})
}
