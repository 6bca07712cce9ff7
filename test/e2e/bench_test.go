package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// execAdd runs the istio-cni binary once, as a runtime does (exec, stdin config,
// CNI_* environment), and returns the wall time from exec to exit and its peak RSS.
func execAdd(b *testing.B, stdin []byte, p *sandboxPod) (time.Duration, int64) {
	cmd := exec.Command(filepath.Join(pluginDir, "istio-cni"))
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + p.containerID, "CNI_NETNS=" + p.netns, "CNI_IFNAME=eth0",
		"CNI_PATH=" + pluginDir, fmt.Sprintf("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_UID=%s", p.ns, p.name, p.uid)}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("istio-cni ADD: %v: %s %s", err, out, stderr.String())
	}
	// getrusage's maxrss would include this test process's memory at fork, so the
	// plugin's own figure (VmHWM, logged at debug) is read from its log.
	_, after, ok := strings.Cut(stderr.String(), "peakRSS=\"")
	if !ok {
		_, after, ok = strings.Cut(stderr.String(), "peakRSS=")
	}
	var kb int64
	if ok {
		fmt.Sscanf(after, "%d", &kb)
	}
	if kb == 0 {
		b.Fatalf("no peak memory in the plugin's log: %s", stderr.String())
	}
	return took, kb
}

func pct(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds()) / 1000
}

// BenchmarkPluginAdd measures the plugin's ADD as the runtime pays it: exec to exit,
// with the pod looked up in the real API server on loopback, for a pod that needs
// redirection (per backend) and for a pod in an excluded namespace; alone and 20 at
// once. It reports p50/p99 in ms, peak RSS and the stripped binary size.
func BenchmarkPluginAdd(b *testing.B) {
	n := newNodeB(b)
	cases := []struct {
		name      string
		namespace string
		extra     map[string]any
	}{
		{"redirect-iptables", "bench", nil},
		{"redirect-nftables", "bench", map[string]any{"native_nftables": true}},
		{"redirect-nftables-agent-cache", "bench", map[string]any{"native_nftables": true}},
		{"excluded-namespace", "kube-system", nil},
	}
	size := strippedSize(b)
	// A second node whose agent serves the pod cache (pods are created on node-1).
	cached := newNodeB(b)
	startPodCache(b, cached)
	for _, tc := range cases {
		for _, parallel := range []int{1, 20} {
			b.Run(fmt.Sprintf("%s/parallel-%d", tc.name, parallel), func(b *testing.B) {
				run := n
				if strings.HasSuffix(tc.name, "-agent-cache") {
					run = cached
				}
				entry := run.istioEntry(tc.extra)
				entry["cniVersion"] = "1.1.0"
				entry["name"] = "k8s-pod-network"
				entry["prevResult"] = &types100.Result{CNIVersion: "1.1.0"}
				stdin, _ := json.Marshal(entry)
				var mu sync.Mutex
				var lat []time.Duration
				var peak int64
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					var sbs []*sandboxPod
					for j := 0; j < parallel; j++ {
						benchSeq++
						name := fmt.Sprintf("%s-%d", tc.name, benchSeq)
						pod := createPodB(b, meshedPod(tc.namespace, name, nil))
						path, err := testns.New(run.dir, "b-"+name)
						if err != nil {
							b.Fatal(err)
						}
						sbs = append(sbs, &sandboxPod{ns: pod.Namespace, name: pod.Name, uid: string(pod.UID), netns: path, containerID: "b" + name})
					}
					if run == cached {
						// Measure the steady state, where the watch has seen the pod.
						ac := kube.NewAgentClient(filepath.Join(cached.runDir, podcache.SocketName), time.Second)
						for _, sb := range sbs {
							for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
								if _, err := ac.GetPod(b.Context(), sb.ns, sb.name); err == nil || time.Now().After(deadline) {
									break
								}
							}
						}
					}
					b.StartTimer()
					var wg sync.WaitGroup
					for _, sb := range sbs {
						wg.Add(1)
						go func() {
							defer wg.Done()
							d, rss := execAdd(b, stdin, sb)
							mu.Lock()
							lat = append(lat, d)
							peak = max(peak, rss)
							mu.Unlock()
						}()
					}
					wg.Wait()
					b.StopTimer()
					for _, sb := range sbs {
						testns.Delete(sb.netns)
					}
					b.StartTimer()
				}
				b.ReportMetric(pct(lat, 0.5), "p50-ms")
				b.ReportMetric(pct(lat, 0.99), "p99-ms")
				b.ReportMetric(float64(peak)/1024, "peakRSS-MB")
				b.ReportMetric(float64(size)/(1<<20), "binary-MB")
			})
		}
	}
}

// benchSeq names benchmark pods uniquely: a benchmark function runs several times.
var benchSeq int

// newNodeB is newNode for a benchmark.
func newNodeB(b *testing.B) *node {
	dir := b.TempDir()
	n := &node{dir: dir, runDir: filepath.Join(dir, "run"), cp: shared, stderr: &logbuf.Buffer{}}
	writeRunDir(b, shared, n.runDir)
	return n
}

type podT = corev1.Pod

var createOpts = metav1.CreateOptions{}

func createPodB(b *testing.B, p *podT) *podT {
	if err := shared.EnsureNamespace(b.Context(), p.Namespace); err != nil {
		b.Fatal(err)
	}
	created, err := shared.AdminClient().CoreV1().Pods(p.Namespace).Create(b.Context(), p, createOpts)
	if err != nil {
		b.Fatal(err)
	}
	return created
}

// strippedSize builds the plugin as it ships (-s -w) and returns its size.
func strippedSize(b *testing.B) int64 {
	root, err := repoRoot()
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(b.TempDir(), "istio-cni")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/istio-cni")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build: %v: %s", err, strings.TrimSpace(string(msg)))
	}
	st, err := os.Stat(out)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}
