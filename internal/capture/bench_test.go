package capture_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/stats"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// defaultSidecarPlan is what istio-cni programs for a typical injected pod.
func defaultSidecarPlan(b *testing.B) *redirect.Plan {
	b.Helper()
	plan := specs.Sidecar().Plan(b)
	return plan
}

func report(b *testing.B, d []time.Duration) {
	b.ReportMetric(stats.Ms(stats.Percentile(d, 0.50)), "p50-ms")
	b.ReportMetric(stats.Ms(stats.Percentile(d, 0.99)), "p99-ms")
}

// BenchmarkApplyFreshNamespace measures what a pod's ADD pays: one apply of the
// default sidecar plan into a new, empty namespace (namespace creation not timed).
func BenchmarkApplyFreshNamespace(b *testing.B) { benchApply(b, 1) }

// BenchmarkApplyParallel20 applies the plan to 20 fresh namespaces at once, as when
// 20 pods start together on a node; it reports per-apply latency.
func BenchmarkApplyParallel20(b *testing.B) { benchApply(b, 20) }

// benchApply applies the default sidecar plan to pods fresh namespaces at once, with
// each backend, and reports the latency of one apply. Making and removing the
// namespaces is not timed.
func benchApply(b *testing.B, pods int) {
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
				nss := make([]string, pods)
				for j := range nss {
					if nss[j], err = testns.New(dir, fmt.Sprintf("ns%d-%d", i, j)); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				var wg sync.WaitGroup
				for _, ns := range nss {
					wg.Go(func() {
						start := time.Now()
						if _, err := capture.Apply(ctx, ns, be, plan); err != nil {
							b.Error(err)
						}
						mu.Lock()
						lat = append(lat, time.Since(start))
						mu.Unlock()
					})
				}
				wg.Wait()
				b.StopTimer()
				for _, ns := range nss {
					testns.Delete(ns)
				}
				b.StartTimer()
			}
			report(b, lat)
		})
	}
}

// BenchmarkApplyUserNamespacedPod is BenchmarkApplyFreshNamespace for a pod with
// hostUsers: false (its network namespace owned by its own user namespace),
// whose iptables tools the backend forks into that user namespace: what such a
// pod's ADD pays, beside the ordinary pod's. The namespace's making is not timed.
func BenchmarkApplyUserNamespacedPod(b *testing.B) {
	ctx := context.Background()
	plan := defaultSidecarPlan(b)
	for name, mk := range backendFactories {
		b.Run(name, func(b *testing.B) {
			be, err := mk(b)
			if err != nil {
				b.Fatal(err)
			}
			var lat []time.Duration
			for b.Loop() {
				b.StopTimer()
				ns := testns.NewInUserNamespace(b)
				b.StartTimer()
				start := time.Now()
				if _, err := capture.Apply(ctx, ns, be, plan); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			report(b, lat)
		})
	}
}
