package lease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/istio-cni/istio-cni/internal/settings"
)

// EnvPodName is the default identity: each agent pod has its own name.
const EnvPodName = "POD_NAME"

// Config is one election's settings.
type Config struct {
	// LeaseName names the Lease, in the namespace given to Run.
	LeaseName string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's: how long a
	// term lasts without renewal, how long the leader keeps trying to renew, and
	// how often every replica tries to acquire or renew.
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Identity names this replica in the Lease (default POD_NAME).
	Identity string
}

// Client-go's usual election timings (those of its leader election example).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Defaults is an election of the Lease name with client-go's usual timings, each
// multiplied by slower: a controller whose take-over may wait eases the load of
// every replica reading the Lease each RetryPeriod. The ratios client-go checks
// (Check) hold for any slower of 1 or more: 15 > 10 + 2.
func Defaults(name string, slower int) Config {
	n := time.Duration(slower)
	return Config{LeaseName: name, LeaseDuration: n * DefaultLeaseDuration, RenewDeadline: n * DefaultRenewDeadline, RetryPeriod: n * DefaultRetryPeriod}
}

// Envs are the variables a controller reads an election's settings from.
type Envs struct {
	LeaseName, LeaseDuration, RenewDeadline, RetryPeriod, Identity string
}

// Read sets c from the variables in envs; Identity falls back to POD_NAME.
func (c *Config) Read(r *settings.Reader, envs Envs) {
	r.NonEmpty(envs.LeaseName, &c.LeaseName)
	r.Duration(envs.LeaseDuration, &c.LeaseDuration, DefaultLeaseDuration.String())
	r.Duration(envs.RenewDeadline, &c.RenewDeadline, DefaultRenewDeadline.String())
	r.Duration(envs.RetryPeriod, &c.RetryPeriod, DefaultRetryPeriod.String())
	r.NonEmpty(EnvPodName, &c.Identity)
	r.NonEmpty(envs.Identity, &c.Identity)
}

// Check adds to p every bad setting, named by its variable in envs. The timing
// rules are client-go's, which would otherwise only fail once the election starts.
func (c Config) Check(p *settings.Problems, envs Envs) {
	if msgs := validation.IsDNS1123Subdomain(c.LeaseName); len(msgs) > 0 {
		p.Add(envs.LeaseName, "%q is not a lease name: %s", c.LeaseName, strings.Join(msgs, "; "))
	}
	if c.Identity == "" {
		p.Add(envs.Identity, "empty (and %s is unset): each replica needs its own name in the lease", EnvPodName)
	}
	if c.RetryPeriod <= 0 {
		p.Add(envs.RetryPeriod, "%s must be positive", c.RetryPeriod)
	}
	if c.RenewDeadline <= time.Duration(1.2*float64(c.RetryPeriod)) {
		p.Add(envs.RenewDeadline, "%s must be longer than 1.2 x %s (%s)", c.RenewDeadline, envs.RetryPeriod, c.RetryPeriod)
	}
	// client-go only requires LeaseDuration > RenewDeadline, but a leader whose
	// renewals fail learns it lost its term only when a renewal attempt starts after
	// RenewDeadline, which is up to one RetryPeriod later: it acts until RenewDeadline
	// + RetryPeriod after its last renewal, and a standby may take the Lease
	// LeaseDuration after it. Only a longer LeaseDuration keeps the two terms apart.
	if c.LeaseDuration <= c.RenewDeadline+c.RetryPeriod {
		p.Add(envs.LeaseDuration, "%s must be longer than %s (%s) + %s (%s) = %s: a leader whose renewals fail keeps acting that long after its last renewal, and another replica may take the Lease after %s",
			c.LeaseDuration, envs.RenewDeadline, c.RenewDeadline, envs.RetryPeriod, c.RetryPeriod, c.RenewDeadline+c.RetryPeriod, envs.LeaseDuration)
	}
}

// Callbacks are called around each term this replica holds.
type Callbacks struct {
	// Lead does the job; its context ends when the term does. It should return
	// only then: a Lead that returns early leaves the replica leading idle.
	Lead func(ctx context.Context)
	// Stopped, if set, is called after each term, once Lead has returned.
	Stopped func()
}

// Run campaigns for the Lease namespace/c.LeaseName until ctx ends, calling
// cb.Lead for each term won. A term ends (Lead's context is cancelled) when a
// renewal fails or ctx ends; Run waits for Lead to return before it calls
// cb.Stopped and campaigns again, so two terms of one replica never overlap. The
// Lease is released when ctx ends. A failing read or write of the Lease is logged
// to log once until its error changes, and its end is logged (reportingLock).
func Run(ctx context.Context, client coordinationv1client.LeasesGetter, namespace string, c Config, log *slog.Logger, cb Callbacks) error {
	lock := &reportingLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: c.LeaseName},
		Client:     client,
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.Identity},
	}, log: log, reported: map[string]string{}}
	// client-go's elector logs each failed attempt at error, one each RetryPeriod
	// while the API server is down (over a thousand lines an hour at the taint's
	// 2 s, on every node); the lock reports them instead, and RunJob each term. A
	// term's work logs as it would have (termLog).
	termLog := klog.FromContext(ctx)
	electing := klog.NewContext(ctx, klog.Logger{}) // the zero logger discards
	for ctx.Err() == nil {
		// client-go starts OnStartedLeading on a goroutine of its own and may return
		// from Run before that goroutine has begun: term decides, race-free, whether
		// this term's Lead runs (leading) or never will (over).
		const idle, leading, over = 0, 1, 2
		var term atomic.Int32
		done := make(chan struct{})
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   c.LeaseDuration,
			RenewDeadline:   c.RenewDeadline,
			RetryPeriod:     c.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            c.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					if !term.CompareAndSwap(idle, leading) {
						return
					}
					defer close(done)
					cb.Lead(klog.NewContext(ctx, termLog))
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election on lease %s/%s: %w", namespace, c.LeaseName, err)
		}
		le.Run(electing)
		if term.CompareAndSwap(idle, over) {
			continue
		}
		<-done
		if cb.Stopped != nil {
			cb.Stopped()
		}
	}
	return nil
}

// Leadership counts one replica's terms, for its controller's metrics.
type Leadership struct {
	// Leading is true while this replica holds the Lease.
	Leading atomic.Bool
	// Elected counts the times this replica became the leader.
	Elected atomic.Uint64
}

// Job is a controller's work that one replica does at a time.
type Job struct {
	// Name names the controller in its logs and errors ("taint controller").
	Name string
	// Leading is logged, with its attributes, when a term starts.
	Leading     string
	LeadingArgs []any
	// Lead does the work until its context ends; an error is logged and the
	// replica stays leader, idle, until the term ends.
	Lead func(ctx context.Context) error
}

// RunJob is Run for a controller: it keeps l up to date and logs each term.
func RunJob(ctx context.Context, client coordinationv1client.LeasesGetter, namespace string, c Config, l *Leadership, log *slog.Logger, j Job) error {
	err := Run(ctx, client, namespace, c, log, Callbacks{
		Lead: func(ctx context.Context) {
			l.Leading.Store(true)
			l.Elected.Add(1)
			log.Info(j.Leading, j.LeadingArgs...)
			if err := j.Lead(ctx); err != nil {
				log.Error(j.Name+" stopped", "error", err)
			}
		},
		Stopped: func() {
			l.Leading.Store(false)
			log.Info("not leading")
		},
	})
	if err != nil {
		return fmt.Errorf("%s: %w", j.Name, err)
	}
	return nil
}

// reportingLock is the Lease's lock, which logs its failures itself: a failed read,
// create or update once until that operation's error changes, and the operation's
// next success. A missing Lease (created next) and a conflict (another replica
// wrote first) are answers, not failures.
type reportingLock struct {
	resourcelock.Interface
	log *slog.Logger

	mu sync.Mutex
	// reported holds the error logged per operation.
	reported map[string]string
}

func (l *reportingLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	l.note(ctx, "read", err)
	return r, raw, err
}

func (l *reportingLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	l.note(ctx, "create", err)
	return err
}

func (l *reportingLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, ler)
	l.note(ctx, "update", err)
	return err
}

func (l *reportingLock) note(ctx context.Context, op string, err error) {
	if ctx.Err() != nil {
		return // stopping: the election's own cancellation
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		err = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	last, failing := l.reported[op]
	switch {
	case err == nil && failing:
		delete(l.reported, op)
		l.log.Info("lease "+op+" succeeds again", "lease", l.Describe())
	case err != nil && err.Error() != last:
		l.reported[op] = err.Error()
		l.log.Error("cannot "+op+" the lease; retrying each retry period, logged again when the error changes", "lease", l.Describe(), "error", err)
	}
}
