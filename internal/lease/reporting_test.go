package lease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// failingLock answers every Get with err.
type failingLock struct {
	resourcelock.Interface
	err error
}

func (l *failingLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return nil, nil, l.err
}

func (l *failingLock) Describe() string { return "istio-system/istio-cni-taint" }

// TestALeaseFailureIsLoggedOnceAndItsEndToo: the reads of a Lease failing the same
// way at every attempt are one error line, a new error another, and the first read
// that is answered says so (a missing Lease is an answer).
func TestALeaseFailureIsLoggedOnceAndItsEndToo(t *testing.T) {
	refused := errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "istio-cni-taint", errors.New("no grant"))
	missing := apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "istio-cni-taint")
	var log logbuf.Buffer
	inner := &failingLock{}
	l := &reportingLock{Interface: inner, log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})), reported: map[string]string{}}
	for _, err := range []error{refused, refused, refused, forbidden, forbidden, missing, nil, refused} {
		inner.err = err
		_, _, _ = l.Get(t.Context())
	}
	got := strings.Split(strings.TrimSpace(log.String()), "\n")
	for i := range got {
		got[i], _, _ = strings.Cut(got[i], " lease=")
	}
	want := []string{
		`level=ERROR msg="cannot read the lease; retrying each retry period, logged again when the error changes"`,
		`level=ERROR msg="cannot read the lease; retrying each retry period, logged again when the error changes"`,
		`level=INFO msg="lease read succeeds again"`,
		`level=ERROR msg="cannot read the lease; retrying each retry period, logged again when the error changes"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log (-want +got):\n%s\n%s", diff, log.String())
	}
}
