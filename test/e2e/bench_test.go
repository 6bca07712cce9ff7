package e2e

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/repo"
	"github.com/istio-cni/istio-cni/test/harness/stats"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// The ADD latency goals of issue 17: a redirected pod's ADD at most a tenth of
// Istio's own plugin's, in each backend, and an excluded namespace's ADD at most
// 2.5 ms exec to exit.
const (
	goalRatio       = 0.10
	goalExcludedADD = 2500 * time.Microsecond
)

// IstioPluginEnv names Istio's istio-cni plugin binary for the side-by-side
// benchmark (built from Istio's source, see the README's "ADD latency"). Without
// it the benchmark reports this plugin's figures only.
const IstioPluginEnv = "ISTIO_CNI_PLUGIN"

// cniRun is one exec of a CNI plugin as a runtime does it (exec, stdin config,
// CNI_* environment): the wall time from exec to exit and what it wrote.
type cniRun struct {
	took           time.Duration
	stdout, stderr string
	// faults is the process's minor page faults (its rusage as wait4 gives it):
	// each page the process touched first, mapped by the kernel at 2-3 us apiece
	// on this VM, about a quarter of the plugin's CPU time in an ADD.
	faults int64
	// volSwitches and invSwitches are its context switches, voluntary (a thread
	// blocked, and waits for a CPU again once woken: the cost that grows with a
	// busy node) and involuntary (a thread was preempted).
	volSwitches, invSwitches int64
	// cpu is the CPU time it took, user and system, all of its threads.
	cpu time.Duration
}

func execPlugin(tb testing.TB, bin string, stdin []byte, env []string, p *sandboxPod) cniRun {
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append([]string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + p.containerID, "CNI_NETNS=" + p.netns, "CNI_IFNAME=eth0",
		"CNI_PATH=" + pluginDir, "PATH=" + os.Getenv("PATH"),
		fmt.Sprintf("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s", p.ns, p.name, p.containerID, p.uid)},
		env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil {
		tb.Fatalf("%s ADD of %s/%s: %v: %s %s", filepath.Base(bin), p.ns, p.name, err, stdout.String(), stderr.String())
	}
	run := cniRun{took: took, stdout: stdout.String(), stderr: stderr.String()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		run.faults, run.volSwitches, run.invSwitches = ru.Minflt, ru.Nvcsw, ru.Nivcsw
		run.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return run
}

// phasesRE reads the phases the plugin logs with its ADD outcome (text handler).
var phasesRE = regexp.MustCompile(`phases\.([A-Za-z0-9-]+)=(\S+)`)

// phasesOf returns the phases of the plugin's ADD log line, in order.
func phasesOf(tb testing.TB, stderr string) ([]string, map[string]time.Duration) {
	var names []string
	out := map[string]time.Duration{}
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.Contains(line, `msg="ADD: `) {
			continue
		}
		for _, m := range phasesRE.FindAllStringSubmatch(line, -1) {
			d, err := time.ParseDuration(m[2])
			if err != nil {
				tb.Fatalf("phase %s=%s: %v", m[1], m[2], err)
			}
			names = append(names, m[1])
			out[m[1]] = d
		}
	}
	if len(names) == 0 {
		tb.Fatalf("no phases in the plugin's log: %s", stderr)
	}
	return names, out
}

// refSandbox is a fresh pod network namespace set up by the reference plugins
// (ptp with host-local), as the chain does before istio-cni; prevResult is their
// result, which the runtime passes to istio-cni.
type refSandbox struct {
	*sandboxPod
	prevResult *types100.Result
}

// refNet runs the reference plugins for the benchmarks.
type refNet struct {
	cni  *libcni.CNIConfig
	conf *libcni.NetworkConfig
}

var refSubnet int

func newRefNet(b *testing.B) *refNet {
	dir := b.TempDir()
	refSubnet++
	raw, _ := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "k8s-pod-network", "type": "ptp", "mtu": 1500,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": filepath.Join(dir, "ipam"),
			"ranges": []any{[]any{map[string]any{"subnet": fmt.Sprintf("10.%d.%d.0/24", 240+refSubnet/250, refSubnet%250)}}},
			"routes": []any{map[string]any{"dst": "0.0.0.0/0"}},
		},
	})
	conf, err := libcni.ConfFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	return &refNet{cni: libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(dir, "cache"), &pluginExec{RawExec: &invoke.RawExec{Stderr: &logbuf.Buffer{}}}), conf: conf}
}

func (r *refNet) rt(sb *sandboxPod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: sb.containerID, NetNS: sb.netns, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", sb.ns}, {"K8S_POD_NAME", sb.name}, {"K8S_POD_UID", sb.uid}}}
}

// sandbox makes a new namespace for pod and runs the reference plugins in it.
func (r *refNet) sandbox(b *testing.B, dir string, pod *corev1.Pod) *refSandbox {
	benchSeq++
	id := fmt.Sprintf("b%d", benchSeq)
	path, err := testns.New(dir, id)
	if err != nil {
		b.Fatal(err)
	}
	sb := &sandboxPod{ns: pod.Namespace, name: pod.Name, uid: string(pod.UID), netns: path, containerID: id}
	res, err := r.cni.AddNetwork(context.Background(), r.conf, r.rt(sb))
	if err != nil {
		testns.Delete(path)
		b.Fatalf("ptp ADD: %v", err)
	}
	prev, err := types100.NewResultFromResult(res)
	if err != nil {
		b.Fatal(err)
	}
	return &refSandbox{sandboxPod: sb, prevResult: prev}
}

func (r *refNet) remove(b *testing.B, sb *refSandbox) {
	if err := r.cni.DelNetwork(context.Background(), r.conf, r.rt(sb.sandboxPod)); err != nil {
		b.Errorf("ptp DEL: %v", err)
	}
	testns.Delete(sb.netns)
}

// stdinWith is a plugin's config as the runtime gives it, with prevResult.
func stdinWith(b *testing.B, entry map[string]any, prev *types100.Result) []byte {
	e := map[string]any{"cniVersion": "1.1.0", "name": "k8s-pod-network"}
	for k, v := range entry {
		e[k] = v
	}
	if prev != nil {
		e["prevResult"] = prev
	}
	out, err := json.Marshal(e)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// istioPeerEntry is Istio's own plugin's entry for the same node: its kubeconfig is
// the same file (<cni_agent_run_dir>/istio-cni-kubeconfig).
func istioPeerEntry(n *node, nftables bool) map[string]any {
	e := map[string]any{"type": "istio-cni", "plugin_log_level": "info", "cni_agent_run_dir": n.runDir,
		"exclude_namespaces": []string{"istio-system", "kube-system"}, "pod_namespace": "istio-system"}
	if nftables {
		e["native_nftables"] = true
	}
	return e
}

// initTime is the plugin's package initialisation, from GODEBUG=inittrace=1 (the
// sum of every package's init clock time), the median of runs.
func initTime(b *testing.B, bin string) time.Duration {
	var runs []time.Duration
	for range 9 {
		recs, _, err := initTrace(bin)
		if err != nil {
			b.Fatal(err)
		}
		var sum time.Duration
		for _, r := range recs {
			sum += r.took
		}
		runs = append(runs, sum)
	}
	return stats.Percentile(runs, 0.5)
}

// BenchmarkPluginAdd measures the plugin's ADD as the runtime pays it, exec to exit,
// side by side with Istio's own plugin (when ISTIO_CNI_PLUGIN names it): the same
// pod in the same real kube-apiserver on loopback, each exec'd into its own fresh
// namespace that the reference plugins (ptp, host-local) have just set up, with
// their result as prevResult, the two taking turns. Cases:
//   - redirect-iptables, redirect-nftables: the pod is looked up in the API server;
//   - ...-agent-cache: the node agent's pod cache answers, from its file of the pod
//     (the default on a node where the agent runs; Istio's plugin has no such
//     cache for sidecar pods);
//   - excluded-namespace: a kube-system pod, no lookup, against exec'ing /bin/true
//     and an empty static Go main (what any Go plugin costs before its own work;
//     the difference is this plugin's package initialisation and its work).
//
// It reports this plugin's p50/p99 (ms), Istio's, the ratio (the median of the
// per-iteration ratios) and the goal, and logs the median of each phase the plugin
// logs, with exec and runtime start-up (the wall time the plugin's phases do not
// cover) and package init (GODEBUG=inittrace=1), then one line per case against
// the goals.
//
// Istio's plugin: make bench and make bench-add build the one hack/tools/istio-cni-peer
// pins (hack/peer.sh) unless ISTIO_CNI_PLUGIN names another; the README's figures
// up to session 16 used 1.29.1's, built from Istio's source at that tag with Go
// 1.26.8 (`-ldflags='-s -w'`, 82 MB). The summary names the module version and Go
// version the binary carries.
func BenchmarkPluginAdd(b *testing.B) {
	istio := os.Getenv(IstioPluginEnv)
	peerDesc := "none"
	if istio != "" {
		peerDesc = describeBinary(istio)
		// Exec'd from a copy, as this plugin is (see installCopy).
		peerCopy := filepath.Join(b.TempDir(), "istio-cni")
		if err := installCopy(istio, peerCopy); err != nil {
			b.Fatalf("%s: %v", IstioPluginEnv, err)
		}
		istio = peerCopy
	}
	n := newNodeB(b)
	cached := newNodeB(b)
	startPodCache(b, cached)
	ours := filepath.Join(pluginDir, "istio-cni")
	initT := initTime(b, ours)
	emptyMain := buildEmptyMain(b)
	ref := newRefNet(b)
	cases := []struct {
		name      string
		namespace string
		nftables  bool
		node      *node
	}{
		{"redirect-iptables", "bench", false, n},
		{"redirect-nftables", "bench", true, n},
		{"redirect-iptables-agent-cache", "bench", false, cached},
		{"redirect-nftables-agent-cache", "bench", true, cached},
		{"excluded-namespace", "kube-system", false, n},
	}
	// The last (largest) run of each case, for the summary after them all.
	summary := map[string]string{}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			pod := createPod(b, shared, meshedPod(tc.namespace, fmt.Sprintf("%s-%d", tc.name, time.Now().UnixNano()), nil))
			if tc.node == cached {
				waitCached(b, cached, pod)
			}
			extra := map[string]any{"plugin_log_level": "info"}
			if tc.nftables {
				extra["native_nftables"] = true
			}
			ourEntry := tc.node.istioEntry(extra)
			excluded := tc.namespace == "kube-system"
			var lat, peer, empty []time.Duration
			var faults, peerFaults, vol, inv []int64
			var cpu, peerCPU []time.Duration
			var ratios []float64
			var kept *refSandbox // the excluded case's one sandbox
			phases := map[string][]time.Duration{}
			var order []string
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var sbs []*refSandbox
				if excluded {
					// One sandbox for every run: an excluded ADD does not enter it, and
					// with a sandbox made and removed around each run, the kernel's
					// teardown of the last one was timed with the next ADD (and with
					// /bin/true: about 0.8 ms on both).
					if kept == nil {
						kept = ref.sandbox(b, tc.node.dir, pod)
						b.Cleanup(func() { ref.remove(b, kept) })
					}
					sbs = []*refSandbox{kept}
				} else {
					sbs = []*refSandbox{ref.sandbox(b, tc.node.dir, pod)}
				}
				if istio != "" && !excluded {
					sbs = append(sbs, ref.sandbox(b, tc.node.dir, pod))
				}
				// Each gets the sandbox set up first as often as the other, in both run
				// orders (the sandbox's age showed as a bias of up to 10 % in paired
				// runs of one binary against a copy of another).
				mine, theirs := sbs[0], sbs[len(sbs)-1]
				if (i/2)%2 == 1 {
					mine, theirs = theirs, mine
				}
				var o, p time.Duration
				runOurs := func() {
					r := execPlugin(b, ours, stdinWith(b, ourEntry, mine.prevResult), nil, mine.sandboxPod)
					o = r.took
					faults, vol, inv = append(faults, r.faults), append(vol, r.volSwitches), append(inv, r.invSwitches)
					cpu = append(cpu, r.cpu)
					names, ph := phasesOf(b, r.stderr)
					if order == nil {
						order = names
					}
					var in time.Duration
					for k, v := range ph {
						phases[k] = append(phases[k], v)
						in += v
					}
					phases["exec+runtime"] = append(phases["exec+runtime"], r.took-in)
				}
				runPeer := func() {
					switch {
					case excluded:
						p = execTook(b, "/bin/true")
						empty = append(empty, execTook(b, emptyMain))
					case istio != "":
						r := execPlugin(b, istio, stdinWith(b, istioPeerEntry(tc.node, tc.nftables), theirs.prevResult), nil, theirs.sandboxPod)
						p = r.took
						peerFaults = append(peerFaults, r.faults)
						peerCPU = append(peerCPU, r.cpu)
					}
				}
				b.StartTimer()
				// Take turns: neither always runs first on a warm cache.
				if i%2 == 0 {
					runOurs()
					runPeer()
				} else {
					runPeer()
					runOurs()
				}
				b.StopTimer()
				lat = append(lat, o)
				if p > 0 {
					peer = append(peer, p)
					ratios = append(ratios, float64(o)/float64(p))
				}
				if !excluded {
					for _, sb := range sbs {
						ref.remove(b, sb)
					}
				}
				b.StartTimer()
			}
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.5)), "p50-ms")
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.99)), "p99-ms")
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(stats.Percentile(faults, 0.5)), "page-faults-p50")
			b.ReportMetric(float64(stats.Percentile(vol, 0.5)), "vol-switches-p50")
			b.ReportMetric(stats.Ms(stats.Percentile(cpu, 0.5)), "cpu-ms-p50")
			if len(peerFaults) > 0 {
				b.ReportMetric(float64(stats.Percentile(peerFaults, 0.5)), "istio-page-faults-p50")
				b.ReportMetric(stats.Ms(stats.Percentile(peerCPU, 0.5)), "istio-cpu-ms-p50")
			}
			peerName := "istio"
			if excluded {
				peerName = "bin-true"
				b.ReportMetric(stats.Ms(goalExcludedADD), "goal-ms")
				b.ReportMetric(stats.Ms(stats.Percentile(empty, 0.5)), "empty-go-main-p50-ms")
			}
			if len(peer) > 0 {
				b.ReportMetric(stats.Ms(stats.Percentile(peer, 0.5)), peerName+"-p50-ms")
				b.ReportMetric(stats.Ms(stats.Percentile(peer, 0.99)), peerName+"-p99-ms")
				if !excluded {
					b.ReportMetric(stats.Percentile(ratios, 0.5), "ratio-vs-istio")
					b.ReportMetric(goalRatio, "goal-ratio")
				}
			}
			var rows []string
			for _, name := range append([]string{"exec+runtime"}, order...) {
				rows = append(rows, fmt.Sprintf("%s %.2f", name, stats.Ms(stats.Percentile(phases[name], 0.5))))
			}
			verdict := ""
			switch {
			case excluded:
				verdict = fmt.Sprintf("p50 %.2f ms (/bin/true %.2f, an empty Go main %.2f), goal <= %.2f ms: %s", stats.Ms(stats.Percentile(lat, 0.5)),
					stats.Ms(stats.Percentile(peer, 0.5)), stats.Ms(stats.Percentile(empty, 0.5)), stats.Ms(goalExcludedADD), met(stats.Percentile(lat, 0.5) <= goalExcludedADD))
			case len(ratios) > 0:
				verdict = fmt.Sprintf("ratio %.3f (p50 %.2f ms vs Istio's %.2f ms), goal <= %.2f: %s", stats.Percentile(ratios, 0.5), stats.Ms(stats.Percentile(lat, 0.5)), stats.Ms(stats.Percentile(peer, 0.5)), goalRatio, met(stats.Percentile(ratios, 0.5) <= goalRatio))
			default:
				verdict = fmt.Sprintf("no ratio: %s names no Istio plugin (make bench-add builds one unless it is none)", IstioPluginEnv)
			}
			process := fmt.Sprintf("median per process: %.2f ms of CPU (user and system, all threads), %d page faults, %d voluntary and %d involuntary context switches",
				stats.Ms(stats.Percentile(cpu, 0.5)), stats.Percentile(faults, 0.5), stats.Percentile(vol, 0.5), stats.Percentile(inv, 0.5))
			if len(peerFaults) > 0 {
				process += fmt.Sprintf(" (Istio's plugin: %.2f ms of CPU, %d page faults)", stats.Ms(stats.Percentile(peerCPU, 0.5)), stats.Percentile(peerFaults, 0.5))
			}
			b.Logf("%s, %d runs: %s\nmedian ms per phase (package init %.2f of exec+runtime): %s\n%s", tc.name, len(lat), verdict, stats.Ms(initT), strings.Join(rows, ", "), process)
			cpuText := fmt.Sprintf("; CPU %.2f ms per ADD", stats.Ms(stats.Percentile(cpu, 0.5)))
			if len(peerCPU) > 0 {
				cpuText += fmt.Sprintf(" (Istio's %.2f)", stats.Ms(stats.Percentile(peerCPU, 0.5)))
			}
			summary[tc.name] = fmt.Sprintf("%-30s %3d runs: %s%s", tc.name, len(lat), verdict, cpuText)
		})
	}
	lines := []string{"ADD against the goals (p50 exec to exit; ratio: median of the per-pair ratios to Istio's plugin):",
		"Istio's plugin: " + peerDesc}
	for _, tc := range cases {
		if l, ok := summary[tc.name]; ok {
			lines = append(lines, l)
		}
	}
	// On stdout: a benchmark with sub-benchmarks prints no log of its own.
	fmt.Println(strings.Join(lines, "\n"))
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// waitCached waits until the agent's pod cache of n holds pod, in its socket and
// its file: the steady state, where the watch has seen the pod before its sandbox
// is made.
func waitCached(b *testing.B, n *node, pod *corev1.Pod) {
	ac := kube.NewAgentClient(filepath.Join(n.runDir, podcache.SocketName), time.Second)
	files := filepath.Join(n.runDir, kube.AgentPodFilesDir)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := ac.GetPod(b.Context(), pod.Namespace, pod.Name, "", 0)
		if err == nil {
			_, err = kube.ReadAgentPodFile(files, pod.Namespace, pod.Name)
		}
		if err == nil {
			return
		} else if time.Now().After(deadline) {
			b.Fatalf("the pod cache does not hold %s/%s: %v", pod.Namespace, pod.Name, err)
		}
	}
}

// BenchmarkPluginAddParallel runs 20 ADDs of redirected pods at once (each its own
// pod and fresh namespace, read from the agent's pod cache as on a node) and
// reports their p50/p99 and the plugin's peak memory. iptables-version-unknown is
// iptables mode with the node's iptables-nft version not yet remembered (after an
// install or a reboot, before a STATUS asked it): every ADD of the batch runs
// iptables-nft-restore --version.
func BenchmarkPluginAddParallel(b *testing.B) {
	n := newNodeB(b)
	startPodCache(b, n)
	ours := filepath.Join(pluginDir, "istio-cni")
	size := strippedSize(b)
	ref := newRefNet(b)
	for _, tc := range []struct {
		name, backend  string
		versionUnknown bool
	}{
		{"iptables", "iptables", false},
		{"iptables-version-unknown", "iptables", true},
		{"nftables", "nftables", false},
	} {
		backend := tc.backend
		b.Run(tc.name, func(b *testing.B) {
			entry := n.istioEntry(map[string]any{"native_nftables": backend == "nftables"})
			var mu sync.Mutex
			var lat []time.Duration
			var peak int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var sbs []*refSandbox
				for j := 0; j < 20; j++ {
					benchSeq++
					pod := createPod(b, shared, meshedPod("bench", fmt.Sprintf("parallel-%s-%d", backend, benchSeq), nil))
					waitCached(b, n, pod)
					sbs = append(sbs, ref.sandbox(b, n.dir, pod))
				}
				if tc.versionUnknown {
					if err := os.Remove(filepath.Join(n.runDir, "xtables", "iptables-nft-version")); err != nil && !errors.Is(err, fs.ErrNotExist) {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				var wg sync.WaitGroup
				for _, sb := range sbs {
					wg.Go(func() {
						r := execPlugin(b, ours, stdinWith(b, entry, sb.prevResult), nil, sb.sandboxPod)
						kb := peakRSS(b, r.stderr)
						mu.Lock()
						lat = append(lat, r.took)
						peak = max(peak, kb)
						mu.Unlock()
					})
				}
				wg.Wait()
				b.StopTimer()
				for _, sb := range sbs {
					ref.remove(b, sb)
				}
				b.StartTimer()
			}
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.5)), "p50-ms")
			b.ReportMetric(stats.Ms(stats.Percentile(lat, 0.99)), "p99-ms")
			b.ReportMetric(float64(peak)/1024, "peakRSS-MB")
			b.ReportMetric(float64(size)/(1<<20), "binary-MB")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// peakRSS reads the plugin's own peak memory (VmHWM, logged at debug) in KiB:
// getrusage's maxrss of a child would include this test process's memory at fork.
func peakRSS(b *testing.B, stderr string) int64 {
	_, after, ok := strings.Cut(stderr, "peakRSS=\"")
	if !ok {
		_, after, ok = strings.Cut(stderr, "peakRSS=")
	}
	var kb int64
	if ok {
		fmt.Sscanf(after, "%d", &kb)
	}
	if kb == 0 {
		b.Fatalf("no peak memory in the plugin's log: %s", stderr)
	}
	return kb
}

// benchSeq names benchmark sandboxes uniquely: a benchmark function runs several times.
var benchSeq int

// newNodeB is newNode for a benchmark.
func newNodeB(b *testing.B) *node {
	dir := b.TempDir()
	n := &node{dir: dir, runDir: filepath.Join(dir, "run"), cp: shared, stderr: &logbuf.Buffer{}}
	writeRunDir(b, shared, n.runDir)
	return n
}

// execTook execs bin with no input and returns its run time, exec to exit.
func execTook(b *testing.B, bin string) time.Duration {
	cmd := exec.Command(bin)
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// buildEmptyMain builds a Go program whose main returns at once, as the plugin is
// built (static, -s -w, the same Go), and returns the path of a copy of it (see
// installCopy): the excluded case's floor for a Go binary.
func buildEmptyMain(b *testing.B) string {
	dir := b.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	built := filepath.Join(dir, "empty.lnk")
	if err := buildAsShipped(dir, built, src); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "empty")
	if err := installCopy(built, out); err != nil {
		b.Fatal(err)
	}
	return out
}

// strippedSize builds the plugin as it ships (-s -w) and returns its size.
func strippedSize(b *testing.B) int64 {
	root, err := repo.Root()
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(b.TempDir(), "istio-cni")
	if err := buildAsShipped(root, out, "./cmd/istio-cni"); err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(out)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}

// describeBinary names a Go binary by what it carries: its path, its main module's
// path and version, and the Go that built it (or why they could not be read).
func describeBinary(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("%s (no Go build information: %v)", path, err)
	}
	return fmt.Sprintf("%s (%s %s, %s)", path, bi.Main.Path, bi.Main.Version, bi.GoVersion)
}

// TestPeerScript: hack/peer.sh, which names the Istio plugin make bench runs beside
// this one, prints the binary ISTIO_CNI_PLUGIN names, an empty line for none, and
// otherwise the pinned build in the cache dir keyed by hack/tools/istio-cni-peer's
// version of istio.io/istio (here a stand-in put there beforehand, so nothing is
// built).
func TestPeerScript(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "hack/tools/istio-cni-peer/go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^(?:require)?\s*istio\.io/istio (v\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatalf("hack/tools/istio-cni-peer/go.mod requires no version of istio.io/istio:\n%s", gomod)
	}
	cache := t.TempDir()
	pinned := filepath.Join(cache, "tools-istio-cni-peer-"+string(m[1]), "istio-cni-peer")
	if err := os.MkdirAll(filepath.Dir(pinned), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pinned, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ env, want string }{
		{"/opt/istio/istio-cni", "/opt/istio/istio-cni\n"},
		{"none", "\n"},
		{"", pinned + "\n"},
	} {
		cmd := exec.Command(filepath.Join(root, "hack/peer.sh"))
		cmd.Env = append(os.Environ(), IstioPluginEnv+"="+tc.env, "ISTIO_CNI_CACHE="+cache)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || string(out) != tc.want || stderr.Len() > 0 {
			t.Errorf("%s=%q hack/peer.sh: printed %q, stderr %q, err %v; want %q and nothing on stderr", IstioPluginEnv, tc.env, out, stderr.String(), err, tc.want)
		}
	}
}
