package scale

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/root"
)

// Settings of the benchmark, from the environment (defaults in brackets):
// SCALE_PODS, the cluster sizes in pods [10000,50000]; SCALE_AGENTS, the real
// agents [50]; SCALE_WINDOW, each measuring window [60s]; SCALE_CHURN, pod
// replacements per node per second while churning [0.05: one every 20 s].
// SCALE_AGENTS=50 on 2 cores and 24 GiB: real processes cost memory (about 37 MiB
// each), so fewer run than a large cluster has nodes; each carries a full node.
func benchSettings(b *testing.B) (sizes []int, agents int, window time.Duration, churnPerNode float64) {
	sizes, agents, window, churnPerNode = []int{10000, 50000}, 50, time.Minute, 0.05
	if v := os.Getenv("SCALE_PODS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < PodsPerNode {
				b.Fatalf("SCALE_PODS=%q: %q is not a pod count of at least %d", v, f, PodsPerNode)
			}
			sizes = append(sizes, n)
		}
	}
	if v := os.Getenv("SCALE_AGENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("SCALE_AGENTS=%q: want a positive number", v)
		}
		agents = n
	}
	if v := os.Getenv("SCALE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 5*time.Second {
			b.Fatalf("SCALE_WINDOW=%q: want a duration of at least 5s", v)
		}
		window = d
	}
	if v := os.Getenv("SCALE_CHURN"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 1 {
			b.Fatalf("SCALE_CHURN=%q: want replacements per node per second in (0, 1]", v)
		}
		churnPerNode = f
	}
	for _, s := range sizes {
		if agents > (s+PodsPerNode-1)/PodsPerNode {
			b.Fatalf("SCALE_AGENTS=%d: more agents than the %d-pod cluster has nodes", agents, s)
		}
	}
	return sizes, agents, window, churnPerNode
}

// result is one cluster size's measurements.
type result struct {
	size         clusterSize
	agents       int
	setup, start time.Duration
	startup      window // from before the agents started until all synced
	// No agents, at rest and while pods churn; then with the agents.
	idle, idleChurn, rest, churning window
	load                            string
}

// BenchmarkClusterScale runs the simulation once per cluster size (whatever b.N)
// and prints per-agent and API server figures at rest and while pods churn, then an
// extrapolation to 5,000 nodes of 110 pods. See the package doc and README's
// "Cluster scale, by simulation".
func BenchmarkClusterScale(b *testing.B) {
	root.Require(b)
	sizes, agents, win, perNode := benchSettings(b)
	var results []result
	for _, pods := range sizes {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			r := runScale(b, clusterSize{Pods: pods, PodsPerNamespace: 100}, agents, win, perNode)
			results = append(results, r)
			b.ReportMetric(r.rest.over(func(i int) float64 { return r.rest.procs[i].RSSKiB / 1024 }).mean, "agent-MiB")
			b.ReportMetric(100*r.rest.over(func(i int) float64 { return r.rest.cpu[i] }).mean, "agent-cpu%-rest")
			b.ReportMetric(100*r.churning.over(func(i int) float64 { return r.churning.cpu[i] }).mean, "agent-cpu%-churn")
			b.ReportMetric(r.rest.over(func(i int) float64 { return float64(r.rest.agents[i].requests()) / r.rest.secs }).mean, "agent-req/s-rest")
			b.ReportMetric(r.churning.over(func(i int) float64 { return float64(r.churning.agents[i].requests()) / r.churning.secs }).mean, "agent-req/s-churn")
		})
	}
	if len(results) > 0 {
		// On stdout, whole: make bench keeps it in bench.out.
		fmt.Printf("\nCluster scale, by simulation (%d real agents; windows of %s)\n\n%s\n", agents, win, table(results, perNode))
	}
}

func runScale(b *testing.B, size clusterSize, agents int, win time.Duration, perNode float64) result {
	b.Helper()
	ctx := b.Context()
	r := result{size: size, agents: agents}
	began := time.Now()
	sm := newSim(b, size)
	r.setup = time.Since(began)
	measure := func(name string, leader int, during func(context.Context) float64) window {
		before, err := sm.snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, win)
		defer cancel()
		churned := during(wctx)
		<-wctx.Done()
		after, err := sm.snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		w := diff(name, before, after, leader)
		w.churned = churned
		return w
	}
	rest := func(context.Context) float64 { return 0 }
	ch := newChurner(loadClient(b, sm.cp), size, 50)
	churning := func(ctx context.Context) float64 {
		n, err := ch.run(ctx, perNode)
		if err != nil {
			b.Logf("churn: %v", err)
		}
		return float64(n)
	}
	r.idle = measure("no agents, at rest", -1, rest)
	r.idleChurn = measure("no agents, pods churning", -1, churning)

	before, err := sm.snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	began = time.Now()
	sm.startAgents(b, agents)
	r.start = time.Since(began)
	waitFor(b, 60*time.Second, "an agent holds the taint lease", func() bool { return sm.leaderIndex(ctx) >= 0 }, nil)
	after, err := sm.snapshot(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Before the start there were no agents: count from zero.
	before.agents = make([]traffic, len(after.agents))
	before.procs = make([]procStat, len(after.procs))
	for i := range before.agents {
		before.agents[i] = traffic{}
	}
	leader := sm.leaderIndex(ctx)
	r.startup = diff("start", before, after, leader)
	// Let the start settle (the taint leader's first pass, the repair queue).
	time.Sleep(10 * time.Second)

	r.rest = measure("agents at rest", leader, rest)
	r.churning = measure("agents, pods churning", leader, churning)
	r.load = loadAverage()
	for _, a := range sm.agents {
		if !a.proc.Running() {
			b.Errorf("agent of %s exited: %v", a.node, a.proc.ExitError())
		}
	}
	return r
}

// table renders the results and the extrapolation as Markdown.
func table(rs []result, perNode float64) string {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	head := "| | " + strings.Join(mapSlice(rs, func(r result) string {
		return fmt.Sprintf("%d pods, %d nodes, %d namespaces", r.size.Pods, r.size.nodes(), r.size.namespaces())
	}), " | ") + " |\n"
	p("%s", head)
	p("|---%s|\n", strings.Repeat("|---", len(rs)))
	row := func(name string, f func(r result) string) {
		p("| %s | %s |\n", name, strings.Join(mapSlice(rs, f), " | "))
	}
	perAgent := func(w func(r result) window, f func(w window, i int) float64, format string) func(r result) string {
		return func(r result) string {
			s := w(r).over(func(i int) float64 { return f(w(r), i) })
			return fmt.Sprintf(format+" (max "+format+")", s.mean, s.max)
		}
	}
	rest := func(r result) window { return r.rest }
	churning := func(r result) window { return r.churning }
	rss := func(w window, i int) float64 { return w.procs[i].RSSKiB / 1024 }
	anon := func(w window, i int) float64 { return w.procs[i].AnonKiB / 1024 }
	cpu := func(w window, i int) float64 { return 100 * w.cpu[i] }
	reqs := func(w window, i int) float64 { return float64(w.agents[i].requests()) / w.secs }
	events := func(w window, i int) float64 { return float64(w.agents[i].Events["pods"]) / w.secs }
	kib := func(w window, i int) float64 { return float64(sum(w.agents[i].Bytes)) / 1024 / w.secs }

	row("real agents (one per node; the taint leader apart)", func(r result) string { return fmt.Sprint(r.agents) })
	row("per agent: memory (VmRSS, MiB) at rest", perAgent(rest, rss, "%.1f"))
	row("per agent: of which private (RssAnon, MiB)", perAgent(rest, anon, "%.1f"))
	row("per agent: memory after churn (MiB)", perAgent(churning, rss, "%.1f"))
	row("per agent: CPU at rest (% of a core)", perAgent(rest, cpu, "%.2f"))
	row("per agent: CPU while churning (% of a core)", perAgent(churning, cpu, "%.2f"))
	row("per agent: API requests/s at rest", perAgent(rest, reqs, "%.2f"))
	row("per agent: API requests/s while churning", perAgent(churning, reqs, "%.2f"))
	row("per agent: pod watch events/s while churning", perAgent(churning, events, "%.2f"))
	row("per agent: KiB/s received while churning", perAgent(churning, kib, "%.2f"))
	row("per agent: watches open", perAgent(rest, func(w window, i int) float64 { return float64(w.agents[i].OpenWatches) }, "%.0f"))
	row("per agent: start (requests; KiB received, gzip; decompressed, of which namespaces)", func(r result) string {
		w := r.startup
		q := w.over(func(i int) float64 { return float64(w.agents[i].requests()) })
		k := w.over(func(i int) float64 { return float64(sum(w.agents[i].Bytes)) / 1024 })
		raw := w.over(func(i int) float64 { return float64(sum(w.agents[i].Raw)) / 1024 })
		return fmt.Sprintf("%.0f; %.0f; %.0f, %.0f", q.mean, k.mean, raw.mean,
			w.over(func(i int) float64 { return float64(w.agents[i].Raw["namespaces"]) / 1024 }).mean)
	})
	row("per agent at rest, by feature (requests/s)", func(r result) string { return byFeature(r.rest) })
	row("per agent while churning, by feature (requests/s)", func(r result) string { return byFeature(r.churning) })
	row("taint leader: memory beyond a non-leader's (MiB); extra requests/s at rest; KiB of Nodes listed (decompressed)", func(r result) string {
		w := r.rest
		if w.leader < 0 {
			return "no leader"
		}
		return fmt.Sprintf("%.1f; %.2f; %.0f", leaderExtraMiB(w),
			float64(w.agents[w.leader].requests())/w.secs-w.over(func(i int) float64 { return float64(w.agents[i].requests()) / w.secs }).mean,
			float64(r.startup.agents[r.startup.leader].Raw["nodes"])/1024)
	})
	row("pod replacements/s achieved (whole cluster; per node)", func(r result) string {
		return fmt.Sprintf("%.1f; %.3f (asked %.3f)", r.churning.churned/r.churning.secs, r.churning.churned/r.churning.secs/float64(r.size.nodes()), perNode)
	})
	api := func(w window) (reqs, watches, cpu float64) {
		reqs = (w.after.api.sum("apiserver_request_total") - w.before.api.sum("apiserver_request_total")) / w.secs
		watches = w.after.api.sum("apiserver_longrunning_requests", `verb="WATCH"`)
		cpu = 100 * (w.after.server["kube-apiserver"].CPUSecs - w.before.server["kube-apiserver"].CPUSecs) / w.secs
		return
	}
	for _, x := range []struct {
		name string
		w    func(r result) window
	}{{"no agents, at rest", func(r result) window { return r.idle }}, {"no agents, pods churning", func(r result) window { return r.idleChurn }},
		{"agents at rest", rest}, {"agents, pods churning", churning}} {
		row("API server, "+x.name+": requests/s; watches open; CPU % of a core; RSS MiB; etcd CPU %", func(r result) string {
			w := x.w(r)
			q, wa, c := api(w)
			etcd := 100 * (w.after.server["etcd"].CPUSecs - w.before.server["etcd"].CPUSecs) / w.secs
			return fmt.Sprintf("%.1f; %.0f; %.1f; %.0f; %.1f", q, wa, c, w.after.server["kube-apiserver"].RSSKiB/1024, etcd)
		})
	}
	row("agents' share of API requests at rest; while churning", func(r result) string {
		share := func(w window) float64 {
			total := w.after.api.sum("apiserver_request_total") - w.before.api.sum("apiserver_request_total")
			var ours float64
			for i := range w.agents {
				ours += float64(w.agents[i].requests())
			}
			return 100 * ours / total
		}
		return fmt.Sprintf("%.0f %%; %.0f %%", share(r.rest), share(r.churning))
	})
	row("setup; agents' start to synced; machine load (1, 5, 15 min)", func(r result) string {
		return fmt.Sprintf("%s; %s; %s", r.setup.Round(time.Second), r.start.Round(time.Second), r.load)
	})
	p("\n%s", extrapolate(rs, perNode))
	return sb.String()
}

func mapSlice[T, U any](s []T, f func(T) U) []U {
	out := make([]U, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}

// byFeature is the mean per agent (taint leader apart) of the request rate by feature.
func byFeature(w window) string {
	sums := map[string]float64{}
	n := 0
	for i, t := range w.agents {
		if i == w.leader && len(w.agents) > 1 {
			continue
		}
		n++
		for c, k := range t.Calls {
			sums[feature(c)] += float64(k)
		}
	}
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(sums)) {
		parts = append(parts, fmt.Sprintf("%s %.3f", f, sums[f]/float64(n)/w.secs))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// leaderExtraMiB is the taint leader's RSS beyond the mean of the other agents.
func leaderExtraMiB(w window) float64 {
	if w.leader < 0 {
		return 0
	}
	return (w.procs[w.leader].RSSKiB - w.over(func(i int) float64 { return w.procs[i].RSSKiB }).mean) / 1024
}

// extrapolate scales the largest run to 5,000 nodes of 110 pods: what an agent
// spends does not depend on the cluster (its node's pods only), except its cache
// of namespaces; what the API server serves grows with the number of agents; the
// taint leader's memory grows with the nodes, by the slope between the runs.
func extrapolate(rs []result, perNode float64) string {
	const nodes, pods = 5000, 5000 * PodsPerNode
	r := rs[len(rs)-1]
	namespaces := pods / r.size.PodsPerNamespace
	w, c := r.rest, r.churning
	restReq := w.over(func(i int) float64 { return float64(w.agents[i].requests()) / w.secs }).mean
	churnReq := c.over(func(i int) float64 { return float64(c.agents[i].requests()) / c.secs }).mean
	watches := w.over(func(i int) float64 { return float64(w.agents[i].OpenWatches) }).mean
	st := r.startup
	// +1: the agents' own namespace.
	nsRaw := st.over(func(i int) float64 { return float64(st.agents[i].Raw["namespaces"]) }).mean / float64(r.size.namespaces()+1)
	nodeRaw := 0.0
	if st.leader >= 0 {
		nodeRaw = float64(st.agents[st.leader].Raw["nodes"]) / float64(r.size.nodes())
	}
	rss := w.over(func(i int) float64 { return w.procs[i].RSSKiB / 1024 }).mean
	cpuRest := w.over(func(i int) float64 { return 100 * w.cpu[i] }).mean
	cpuChurn := c.over(func(i int) float64 { return 100 * c.cpu[i] }).mean
	var sb strings.Builder
	fmt.Fprintf(&sb, "Extrapolated to %d nodes x %d pods (%d namespaces of %d pods), from the %d-pod run:\n", nodes, PodsPerNode, namespaces, r.size.PodsPerNamespace, r.size.Pods)
	fmt.Fprintf(&sb, "- per agent, as measured (its node's pods only): %.1f MiB, %.2f %% of a core at rest, %.2f %% while its node replaces a pod every %.0f s; %.2f requests/s at rest, %.2f while churning\n",
		rss, cpuRest, cpuChurn, 1/perNode, restReq, churnReq)
	fmt.Fprintf(&sb, "- per agent, what grows with the cluster: the pod cache's namespaces, %.0f B each listed (protobuf): %.1f MiB listed at start for %d namespaces, held trimmed to name and labels\n",
		nsRaw, nsRaw*float64(namespaces)/(1<<20), namespaces)
	if len(rs) > 1 && rs[0].rest.leader >= 0 && r.rest.leader >= 0 {
		slope := (leaderExtraMiB(r.rest) - leaderExtraMiB(rs[0].rest)) / float64(r.size.nodes()-rs[0].size.nodes())
		if slope > 0 {
			fmt.Fprintf(&sb, "- taint leader (one agent): its cache of Nodes, %.1f KiB each listed (protobuf); its memory beyond a non-leader's grew %.1f KiB per node between the runs: about %.0f MiB more than a non-leader at %d nodes\n",
				nodeRaw/1024, slope*1024, leaderExtraMiB(r.rest)+slope*float64(nodes-r.size.nodes()), nodes)
		} else {
			fmt.Fprintf(&sb, "- taint leader (one agent): its cache of Nodes, %.1f KiB each listed (protobuf); its extra memory did not grow measurably between the runs (RSS noise)\n", nodeRaw/1024)
		}
	}
	fmt.Fprintf(&sb, "- API server: %.0f watches open by the agents; %.0f requests/s from them at rest; %.0f requests/s while every node replaces a pod every %.0f s\n",
		watches*nodes, restReq*nodes, churnReq*nodes, 1/perNode)
	apiCPU := func(w window) float64 {
		return (w.after.server["kube-apiserver"].CPUSecs - w.before.server["kube-apiserver"].CPUSecs) / w.secs
	}
	perAgentRest := (apiCPU(r.rest) - apiCPU(r.idle)) / float64(r.agents)
	// While churning, the churn's own cost varies more between windows than the
	// agents add: only the figure at rest is extrapolated.
	fmt.Fprintf(&sb, "- API server CPU for the agents at rest (with agents minus without, per agent, times %d): %.1f cores of this machine (noisy: compare runs)\n",
		nodes, perAgentRest*nodes)
	return sb.String()
}
