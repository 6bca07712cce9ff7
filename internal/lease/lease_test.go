package lease

import (
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/settings"
)

var testEnvs = Envs{LeaseName: "X_LEASE_NAME", LeaseDuration: "X_LEASE_DURATION", RenewDeadline: "X_RENEW_DEADLINE", RetryPeriod: "X_RETRY_PERIOD", Identity: "X_IDENTITY"}

func check(c Config) error {
	var p settings.Problems
	c.Check(&p, testEnvs)
	return p.Err()
}

// TestCheckKeepsTwoTermsApart: a leader whose renewals fail keeps its term until
// RenewDeadline + RetryPeriod after its last renewal, so a LeaseDuration not longer
// than that lets a standby lead beside it; Check refuses it naming the three values.
func TestCheckKeepsTwoTermsApart(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		ok                  bool
	}{
		{15 * time.Second, 10 * time.Second, 2 * time.Second, true},  // client-go's usual
		{40 * time.Second, 20 * time.Second, 15 * time.Second, true}, // the chart's
		{30 * time.Second, 20 * time.Second, 15 * time.Second, false},
		{35 * time.Second, 20 * time.Second, 15 * time.Second, false}, // exactly renew + retry
		{2 * time.Second, 1500 * time.Millisecond, 200 * time.Millisecond, true},
	} {
		err := check(Config{LeaseName: "l", Identity: "me", LeaseDuration: tc.lease, RenewDeadline: tc.renew, RetryPeriod: tc.retry})
		if tc.ok {
			if err != nil {
				t.Errorf("%s/%s/%s refused: %v", tc.lease, tc.renew, tc.retry, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s/%s/%s accepted: two leaders can overlap", tc.lease, tc.renew, tc.retry)
			continue
		}
		for _, want := range []string{"X_LEASE_DURATION", "X_RENEW_DEADLINE", "X_RETRY_PERIOD", tc.lease.String(), tc.renew.String(), tc.retry.String()} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s/%s/%s: error %q does not name %s", tc.lease, tc.renew, tc.retry, err, want)
			}
		}
	}
}

// TestDefaultsPassCheck: every Defaults the controllers use passes Check.
func TestDefaultsPassCheck(t *testing.T) {
	for _, slower := range []int{1, 2, 4, 8} {
		c := Defaults("l", slower)
		c.Identity = "me"
		if err := check(c); err != nil {
			t.Errorf("Defaults(l, %d): %v", slower, err)
		}
	}
}
