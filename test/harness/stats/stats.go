// Package stats is the benchmarks' arithmetic: one definition of a percentile and
// of the milliseconds they report, for every package `make bench` runs.
package stats

import (
	"cmp"
	"slices"
	"time"
)

// Percentile is the value of v at fraction p (0 to 1) of its sorted order, by
// nearest rank: index p*len(v), the largest for p near 1. v is not changed; an
// empty v gives the zero value.
func Percentile[T cmp.Ordered](v []T, p float64) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// Ms is d in milliseconds, to the microsecond, as the benchmarks report times.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
