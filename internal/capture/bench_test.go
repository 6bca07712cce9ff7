package capture_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
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
func BenchmarkApplyFreshNamespace(b *testing.B) { benchApply(b, defaultSidecarPlan(b), 1) }

// BenchmarkApplyFreshNamespaceRouted is BenchmarkApplyFreshNamespace for the
// plans whose apply also sets up routing, after the rules (capture.Apply): a
// TPROXY pod's (IPv4: the fwmark rule and table 133's local route, each looked
// for before it is added) and a dual-stack REDIRECT pod's (IPv6's passthrough
// address ::6 on lo, looked for too). The default plan needs no routing.
func BenchmarkApplyFreshNamespaceRouted(b *testing.B) {
	for _, c := range []struct {
		name string
		plan specs.Settings
	}{
		{"TPROXY", specs.Sidecar().With(specs.Settings{redirect.FieldMode: "TPROXY"})},
		{"dual-stack-REDIRECT", specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"})},
	} {
		b.Run(c.name, func(b *testing.B) { benchApply(b, c.plan.Plan(b), 1) })
	}
}

// BenchmarkApplyParallel20 applies the plan to 20 fresh namespaces at once, as when
// 20 pods start together on a node; it reports per-apply latency.
func BenchmarkApplyParallel20(b *testing.B) { benchApply(b, defaultSidecarPlan(b), 20) }

// benchApply applies plan to pods fresh namespaces at once.
func benchApply(b *testing.B, plan *redirect.Plan, pods int) {
	dir := b.TempDir()
	made := 0 // names every namespace of the benchmark apart, whichever backend's
	benchApplies(b, plan, func(b *testing.B) ([]string, func()) {
		nss := make([]string, pods)
		for j := range nss {
			var err error
			if nss[j], err = testns.New(dir, fmt.Sprintf("ns%d", made)); err != nil {
				b.Fatal(err)
			}
			made++
		}
		return nss, func() {
			for _, ns := range nss {
				testns.Delete(ns)
			}
		}
	})
}

// BenchmarkApplyUserNamespacedPod is BenchmarkApplyFreshNamespace for a pod with
// hostUsers: false (its network namespace owned by its own user namespace),
// whose iptables tools the backend forks into that user namespace: what such a
// pod's ADD pays, beside the ordinary pod's. The namespace's making is not timed.
func BenchmarkApplyUserNamespacedPod(b *testing.B) {
	benchApplies(b, defaultSidecarPlan(b), func(b *testing.B) ([]string, func()) {
		// Removed with the benchmark (the process holding it is killed then).
		return []string{testns.NewInUserNamespace(b)}, func() {}
	})
}

// benchApplies runs, with each backend (a sub-benchmark of its name), rounds of
// applies of plan, one into each namespace that fresh makes for the round, all
// at once, and reports the latency of one apply. Making the namespaces and
// removing them after their round are not timed. For a plan with routing it
// reports the routing step's median too (routing-p50-ms: capture.Apply's
// "routing" phase).
func benchApplies(b *testing.B, plan *redirect.Plan, fresh func(b *testing.B) (nss []string, remove func())) {
	routed := plan.Routing != nil || plan.IPv6InboundPassthroughAddr.IsValid()
	for name, mk := range backendFactories {
		b.Run(name, func(b *testing.B) {
			be, err := mk(b)
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat, routing []time.Duration
			for b.Loop() {
				b.StopTimer()
				nss, remove := fresh(b)
				b.StartTimer()
				var wg sync.WaitGroup
				for _, ns := range nss {
					wg.Go(func() {
						ctx, rec := context.Background(), (*timing.Recorder)(nil)
						if routed {
							rec = timing.Start()
							ctx = timing.With(ctx, rec)
						}
						start := time.Now()
						if _, err := capture.Apply(ctx, ns, be, plan); err != nil {
							b.Error(err)
						}
						took := time.Since(start)
						mu.Lock()
						lat = append(lat, took)
						for _, p := range rec.Phases() {
							if p.Name == "routing" {
								routing = append(routing, p.Took)
							}
						}
						mu.Unlock()
					})
				}
				wg.Wait()
				b.StopTimer()
				remove()
				if b.Failed() {
					b.FailNow()
				}
				b.StartTimer()
			}
			report(b, lat)
			if routed {
				b.ReportMetric(stats.Ms(stats.Percentile(routing, 0.50)), "routing-p50-ms")
			}
		})
	}
}
