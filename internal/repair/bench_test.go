package repair

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/stats"
)

// BenchmarkTimeFromValidationFailureToAction measures, for each action, the time
// from the status update that reports the failed validation (what the kubelet
// sends) to the controller's API call (delete, label) or programmed namespace
// (repair in place) completing: 20 pods one after another, p50 and max reported.
func BenchmarkTimeFromValidationFailureToAction(b *testing.B) {
	root.Require(b)
	cp := startControlPlane(b)
	admin := cp.AdminClient()
	const samples = 20
	for _, action := range []Action{ActionLabel, ActionDelete, ActionRepair} {
		b.Run(string(action), func(b *testing.B) {
			node := "bench-" + string(action)
			cfg := testConfig(node)
			cfg.RepairPods, cfg.DeletePods, cfg.LabelPods = action == ActionRepair, action == ActionDelete, action == ActionLabel
			var deps Deps
			if action == ActionRepair {
				deps = inPlaceDeps(b, &ProcFinder{ProcDir: "/proc"})
			}
			c := runController(b, cfg, admin, deps)
			var lat []time.Duration
			for i := range b.N * samples {
				ip := netip.AddrFrom4([4]byte{10, 252, byte(i / 250), byte(1 + i%250)})
				if action == ActionRepair {
					newPodNetns(b, b.TempDir(), "pod", ip, true, false)
				}
				pod := createPod(b, admin, injectedPod(fmt.Sprintf("%s-%d", action, i), node))
				before := c.Metrics().PodsRepaired(action, ResultSuccess)
				start := time.Now()
				setValidation(b, admin, pod, ip.String(), 126, "")
				for c.Metrics().PodsRepaired(action, ResultSuccess) == before {
					if time.Since(start) > 30*time.Second {
						b.Fatalf("pod %s: no %s after 30s", pod.Name, action)
					}
					time.Sleep(200 * time.Microsecond)
				}
				lat = append(lat, time.Since(start))
			}
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.5)), "p50-ms")
			b.ReportMetric(stats.Ms(slices.Max(lat)), "max-ms")
			b.Logf("%s: n=%d p50=%s p90=%s max=%s", action, len(lat), stats.Percentile(lat, 0.5).Round(10*time.Microsecond),
				stats.Percentile(lat, 0.9).Round(10*time.Microsecond), slices.Max(lat).Round(10*time.Microsecond))
		})
	}
}

// createPods creates n injected pods spread over nodes, 16 at a time.
func createPods(b *testing.B, c kubernetes.Interface, prefix string, n int, node func(i int) string) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				p := injectedPod(fmt.Sprintf("%s-%d", prefix, i), node(i))
				p.Labels = map[string]string{"app": prefix, "pod-template-hash": "7d9c8b6f5"}
				if _, err := c.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

type memSample struct{ heap, rss uint64 }

func sampleMem() memSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heap: ms.HeapInuse, rss: rssBytes()}
}

func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func kib(a, b uint64) float64 { return (float64(a) - float64(b)) / 1024 }

// BenchmarkControllerMemory measures the controller's heap with 250 pods on its
// node, then again after 5,000 pods are created on 100 other nodes: the field
// selector keeps them out of its cache, so the second figure is flat. For contrast
// it then measures an informer over every pod (what a controller without the
// selector would hold).
func BenchmarkControllerMemory(b *testing.B) {
	cp := startControlPlane(b)
	cfgREST := cp.AdminRESTConfig()
	cfgREST.QPS, cfgREST.Burst = 2000, 2000
	admin, err := kubernetes.NewForConfig(cfgREST)
	if err != nil {
		b.Fatal(err)
	}
	const onNode, elsewhere = 250, 5000
	node := "bench-mem"
	start := time.Now()
	createPods(b, admin, "local", onNode, func(int) string { return node })
	b.Logf("created %d pods on %s in %s", onNode, node, time.Since(start).Round(time.Millisecond))

	for range b.N {
		base := sampleMem()
		cfg := testConfig(node)
		cfg.RepairPods, cfg.LabelPods = false, true
		c := runController(b, cfg, admin, Deps{})
		withLocal := sampleMem()
		if n := len(c.informer.GetStore().ListKeys()); n != onNode {
			b.Fatalf("cache holds %d pods, want %d", n, onNode)
		}

		start = time.Now()
		createPods(b, admin, "remote", elsewhere, func(i int) string { return fmt.Sprintf("other-%d", i%100) })
		b.Logf("created %d pods on 100 other nodes in %s (%.0f/s)", elsewhere, time.Since(start).Round(time.Millisecond),
			float64(elsewhere)/time.Since(start).Seconds())
		time.Sleep(2 * time.Second) // let any watch traffic arrive
		withRemote := sampleMem()
		if n := len(c.informer.GetStore().ListKeys()); n != onNode {
			b.Fatalf("cache holds %d pods after the others were created, want %d", n, onNode)
		}

		// Contrast: an informer over every pod in the cluster.
		ctx, cancel := context.WithCancel(context.Background())
		f := informers.NewSharedInformerFactory(admin, 0)
		inf := f.Core().V1().Pods().Informer()
		f.Start(ctx.Done())
		cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
		all := sampleMem()
		total := len(inf.GetStore().ListKeys())
		cancel()
		f.Shutdown()

		b.ReportMetric(kib(withLocal.heap, base.heap), "heap-KiB-250-local")
		b.ReportMetric(kib(withRemote.heap, withLocal.heap), "heap-KiB-growth-5000-remote")
		b.ReportMetric(kib(all.heap, withRemote.heap), "heap-KiB-unfiltered-informer")
		b.Logf("heap in use: +%.0f KiB for the controller with %d pods on its node; %+.0f KiB after %d pods on other nodes; "+
			"an unfiltered informer over all %d pods would add %.0f KiB",
			kib(withLocal.heap, base.heap), onNode, kib(withRemote.heap, withLocal.heap), elsewhere, total, kib(all.heap, withRemote.heap))
		b.Logf("RSS: %.0f MiB before, %.0f MiB with the controller, %.0f MiB after the remote pods (includes the test's own client that created them), %.0f MiB with the unfiltered informer",
			float64(base.rss)/(1<<20), float64(withLocal.rss)/(1<<20), float64(withRemote.rss)/(1<<20), float64(all.rss)/(1<<20))
	}
}
