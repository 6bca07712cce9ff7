package stats

import (
	"testing"
	"time"
)

func TestPercentileIsTheNearestRankOfASortedCopy(t *testing.T) {
	v := []time.Duration{9, 1, 8, 2, 7, 3, 6, 4, 5, 10}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {0.5, 6}, {0.9, 10}, {0.99, 10}, {1, 10}} {
		if got := Percentile(v, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", v, tc.p, got, tc.want)
		}
	}
	if v[0] != 9 {
		t.Errorf("Percentile sorted its argument: %v", v)
	}
	if got := Percentile([]float64(nil), 0.5); got != 0 {
		t.Errorf("Percentile of nothing = %v, want 0", got)
	}
	if got := Ms(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("Ms(1.5ms) = %v", got)
	}
}
