package timing

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MaxPhases bounds a recorder: a command has a dozen phases; a loop that marks
// once per try stops being recorded past this (the last slot counts the rest).
const MaxPhases = 32

// Recorder holds the phases of one command in the order they ended.
type Recorder struct {
	mu     sync.Mutex
	last   time.Time
	phases []Phase
}

// Phase is one named span of a command.
type Phase struct {
	Name string
	Took time.Duration
}

// Start returns a recorder whose first phase begins now.
func Start() *Recorder { return StartAt(time.Now()) }

// StartAt returns a recorder whose first phase began at t.
func StartAt(t time.Time) *Recorder { return &Recorder{last: t} }

type ctxKey struct{}

// With returns ctx carrying r, for Mark.
func With(ctx context.Context, r *Recorder) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// From returns the recorder ctx carries, or nil.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(ctxKey{}).(*Recorder)
	return r
}

// Mark ends the current phase of ctx's recorder under name (the time since the
// previous mark) and starts the next. Without a recorder it does nothing.
func Mark(ctx context.Context, name string) {
	if r := From(ctx); r != nil {
		r.Mark(name)
	}
}

// Mark ends the current phase under name and starts the next. A name marked again
// adds to its phase (a retried step is one phase).
func (r *Recorder) Mark(name string) {
	if r == nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	d := now.Sub(r.last)
	r.last = now
	for i := range r.phases {
		if r.phases[i].Name == name {
			r.phases[i].Took += d
			return
		}
	}
	if len(r.phases) == MaxPhases {
		r.phases[MaxPhases-1].Name = "other"
		r.phases[MaxPhases-1].Took += d
		return
	}
	r.phases = append(r.phases, Phase{Name: name, Took: d})
}

// Phases returns the phases so far, in the order they were first marked.
func (r *Recorder) Phases() []Phase {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Phase(nil), r.phases...)
}

// LogValue is the phases as a log group: phases.lookup=412µs phases.restore-ipv4=2.1ms.
func (r *Recorder) LogValue() slog.Value {
	ps := r.Phases()
	attrs := make([]slog.Attr, len(ps))
	for i, p := range ps {
		attrs[i] = slog.Duration(p.Name, p.Took)
	}
	return slog.GroupValue(attrs...)
}
