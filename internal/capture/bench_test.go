package capture_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// defaultSidecarPlan is what istio-cni programs for a typical injected pod.
func defaultSidecarPlan(b *testing.B) *redirect.Plan {
	b.Helper()
	plan := specs.Sidecar().Plan(b)
	return plan
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func report(b *testing.B, d []time.Duration) {
	b.ReportMetric(float64(percentile(d, 0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds())/1000, "p99-ms")
}

// BenchmarkApplyFreshNamespace measures what a pod's ADD pays: one apply of the
// default sidecar plan into a new, empty namespace (namespace creation not timed).
func BenchmarkApplyFreshNamespace(b *testing.B) {
	ctx := context.Background()
	plan := defaultSidecarPlan(b)
	for name, mk := range backendFactories {
		b.Run(name, func(b *testing.B) {
			be, err := mk(b)
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ns, err := netns.New(dir, fmt.Sprint("ns", i))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				if _, err := capture.Apply(ctx, ns, be, plan); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				netns.Delete(ns)
				b.StartTimer()
			}
			report(b, lat)
		})
	}
}

// BenchmarkApplyParallel20 applies the plan to 20 fresh namespaces at once, as when
// 20 pods start together on a node; it reports per-apply latency.
func BenchmarkApplyParallel20(b *testing.B) {
	ctx := context.Background()
	plan := defaultSidecarPlan(b)
	for name, mk := range backendFactories {
		b.Run(name, func(b *testing.B) {
			be, err := mk(b)
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			var mu sync.Mutex
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var nss []string
				for j := 0; j < 20; j++ {
					ns, err := netns.New(dir, fmt.Sprintf("ns%d-%d", i, j))
					if err != nil {
						b.Fatal(err)
					}
					nss = append(nss, ns)
				}
				b.StartTimer()
				var wg sync.WaitGroup
				for _, ns := range nss {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						if _, err := capture.Apply(ctx, ns, be, plan); err != nil {
							b.Error(err)
						}
						mu.Lock()
						lat = append(lat, time.Since(start))
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.StopTimer()
				for _, ns := range nss {
					netns.Delete(ns)
				}
				b.StartTimer()
			}
			report(b, lat)
		})
	}
}
