package nodee2e

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/istio-cni/istio-cni/test/harness/stats"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// BenchmarkPodStartLatency starts b.N meshed pods one after the other, without and
// then with istio-cni in the node's chain, and reports:
//   - start-p50-ms, start-p99-ms: pod create -> Ready, as a client of the API sees it
//     (kubelet's status comes after its 1 s PLEG relist, so these are coarse);
//   - sandbox-mean-ms: kubelet's own RunPodSandbox time (its
//     kubelet_runtime_operations_duration_seconds sum/count over the run), which is
//     where the CNI chain runs: the difference between the two is what istio-cni
//     adds to every pod.
//
// With istio-cni it also reports helm install -> agent Ready (install-to-ready-ms)
// and the plugin's own ADD time (plugin-add-p50-ms, -p99-ms) from the decisions the
// agent logs.
func BenchmarkPodStartLatency(b *testing.B) {
	for _, withCNI := range []bool{false, true} {
		name := "without-istio-cni"
		if withCNI {
			name = "with-istio-cni"
		}
		b.Run(name, func(b *testing.B) {
			s := session(b)
			s.Out = discard{}
			var installToReady time.Duration
			if withCNI {
				began := time.Now()
				install(b, s, values(b))
				installToReady = time.Since(began)
				if !slices.Equal(conflistTypes(b), []string{"ptp", "istio-cni"}) {
					b.Fatalf("istio-cni is not in the chain: %v", conflistTypes(b))
				}
			} else if slices.Contains(conflistTypes(b), "istio-cni") {
				b.Fatalf("istio-cni is still in the chain: %v", conflistTypes(b))
			}
			ctx := context.Background()
			ns := "bench-" + name
			sumBefore, countBefore := sandboxMetric(b)
			var lat []time.Duration
			var pods []*corev1.Pod
			// The plugin's log keeps the records of a run before this one (the
			// testing package's first run with b.N=1 names its pods the same).
			since := time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := meshnode.MeshedPod(ns, fmt.Sprintf("p%d", i))
				p.Spec.Containers[1].ReadinessProbe = nil // Ready as soon as both containers run
				d, err := startPod(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, d)
				pods = append(pods, p)
			}
			b.StopTimer()
			sumAfter, countAfter := sandboxMetric(b)
			for _, p := range pods {
				theNode.Client().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
			waitPodsGone(b, pods)
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.5)), "start-p50-ms")
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.99)), "start-p99-ms")
			if n := countAfter - countBefore; n > 0 {
				b.ReportMetric((sumAfter-sumBefore)/n*1000, "sandbox-mean-ms")
			}
			if withCNI {
				b.ReportMetric(stats.Ms(installToReady), "install-to-ready-ms")
				if took := pluginAddTimes(b, ns, since); len(took) > 0 {
					b.ReportMetric(stats.Ms(stats.Percentile(took, 0.5)), "plugin-add-p50-ms")
					b.ReportMetric(stats.Ms(stats.Percentile(took, 0.99)), "plugin-add-p99-ms")
				}
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// startPod creates p and returns the time until the API shows it Ready.
func startPod(ctx context.Context, p *corev1.Pod) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := meshnode.EnsureNamespace(ctx, theNode, p.Namespace); err != nil {
		return 0, err
	}
	pods := theNode.Client().CoreV1().Pods(p.Namespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String()})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	began := time.Now()
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	for ev := range w.ResultChan() {
		if ev.Type != watch.Added && ev.Type != watch.Modified {
			continue
		}
		if got, ok := ev.Object.(*corev1.Pod); ok {
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return time.Since(began), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("pod %s/%s: not Ready: %w", p.Namespace, p.Name, ctx.Err())
}

// sandboxMetric reads kubelet's RunPodSandbox duration sum (seconds) and count from
// its /metrics, through the API server's node proxy.
func sandboxMetric(tb testing.TB) (sum, count float64) {
	tb.Helper()
	raw, err := theNode.Client().CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", theNode.Name(), "proxy", "metrics").DoRaw(context.Background())
	if err != nil {
		tb.Fatalf("kubelet metrics: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `operation_type="run_podsandbox"`) || !strings.HasPrefix(line, "kubelet_runtime_operations_duration_seconds_") {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.HasPrefix(line, "kubelet_runtime_operations_duration_seconds_sum"):
			sum = v
		case strings.HasPrefix(line, "kubelet_runtime_operations_duration_seconds_count"):
			count = v
		}
	}
	return sum, count
}

// pluginAddTimes are the "took" of the plugin's ADDs that captured pods in
// namespace since then, from the records the plugin sends to the agent (pluginADDs).
func pluginAddTimes(tb testing.TB, namespace string, since time.Time) []time.Duration {
	tb.Helper()
	ok, _ := pluginADDs(tb, namespace, since)
	var took []time.Duration
	for _, a := range ok {
		took = append(took, a.Took)
	}
	slices.Sort(took)
	return took
}

// churnOnce holds the one run of the churn scenario that every call of
// BenchmarkMeshedPodsThroughAgentChurn reports: the scenario takes minutes and
// means nothing per b.N, and the testing package calls a benchmark more than once
// (b.N=1 first, then the -benchtime count).
var churnOnce *churnResult

// BenchmarkMeshedPodsThroughAgentChurn plays the upgrade/kill/stop/reboot scenario
// of TestMeshedPodsStartCapturedThroughAgentUpgradeKillStopAndNodeReboot once and
// reports its counts (pods per outcome, over every phase and the residents) and
// the longest a pod waited for the plugin (created -> sandbox ready); the table
// per phase goes to the log. It asserts nothing.
func BenchmarkMeshedPodsThroughAgentChurn(b *testing.B) {
	if churnOnce == nil {
		s := session(b)
		s.Out = discard{}
		// The table first: a benchmark's log is cut after 10 lines.
		var phases []string
		churnOnce = runChurn(b, s, defaultChurn(), func(format string, args ...any) {
			phases = append(phases, fmt.Sprintf(format, args...))
		})
		b.Logf("outcomes per phase:\n%s", churnOnce.table())
		b.Logf("%s", strings.Join(phases, "\n"))
		if churnOnce.Uninstall != nil {
			b.Logf("helm uninstall left the CNI dirs changed: %v", churnOnce.Uninstall)
		}
	}
	r := churnOnce
	var pods, trafficFailed int
	for _, row := range r.Rows {
		pods += row.Created
		trafficFailed += row.TrafficFailed
	}
	b.ReportMetric(float64(pods), "pods")
	for o, unit := range map[outcome]string{captured: "captured", retried: "refused-retried", repaired: "repaired",
		unprotected: "unprotected", neverStarted: "never-started"} {
		b.ReportMetric(float64(r.total(o)), unit)
	}
	b.ReportMetric(float64(trafficFailed), "traffic-failed")
	b.ReportMetric(stats.Ms(r.MaxWait), "max-wait-ms")
	b.ReportMetric(0, "ns/op")
}
