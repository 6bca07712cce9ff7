package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// feature names what an agent's request is for, from the request alone.
func feature(c call) string {
	switch {
	case c.Resource == "leases":
		return "taint election (lease)"
	case c.Resource == "nodes" || (c.Resource == "pods" && c.Namespace == agentNamespace && c.LabelSelector != ""):
		return "taint leader (nodes, agent pods)"
	case c.Resource == "namespaces":
		return "pod cache (namespaces)"
	case c.Resource == "pods" && strings.HasPrefix(c.FieldSelector, "spec.nodeName=") && (c.Verb == "list" || c.Verb == "watch"):
		return "pod cache + repair (node's pods)"
	case (c.Resource == "pods" && c.Verb == "delete") || c.Resource == "events" || (c.Resource == "pods" && c.Subresource == "status"):
		return "repair actions"
	default:
		return "start and exit (own pod, DaemonSet, plugin token)"
	}
}

// metricsText is the API server's /metrics, as "name{labels} value" lines.
type metricsText []string

func scrapeAPIServer(ctx context.Context, c kubernetes.Interface) (metricsText, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server /metrics: %w", err)
	}
	var lines metricsText
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && l[0] != '#' {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}

// sum adds the series of metric name whose labels contain every one of labels
// (each as `key="value"`).
func (m metricsText) sum(name string, labels ...string) float64 {
	total := 0.0
	for _, l := range m {
		series, v, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		n, lbl, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		if !all(labels, func(s string) bool { return strings.Contains(lbl, s) }) {
			continue
		}
		if f, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil {
			total += f
		}
	}
	return total
}

func all[T any](s []T, f func(T) bool) bool {
	return !slices.ContainsFunc(s, func(v T) bool { return !f(v) })
}

// snapshot is everything measured at one moment.
type snapshot struct {
	at     time.Time
	agents []traffic
	procs  []procStat
	api    metricsText
	server map[string]procStat // etcd and kube-apiserver
}

func (sm *sim) snapshot(ctx context.Context) (snapshot, error) {
	s := snapshot{at: time.Now(), server: map[string]procStat{}}
	for _, a := range sm.agents {
		s.agents = append(s.agents, a.proxy.snapshot())
		p, err := readProc(a.proc.Pid())
		if err != nil {
			return s, fmt.Errorf("agent of %s: %w", a.node, err)
		}
		s.procs = append(s.procs, p)
	}
	for name, pid := range sm.cp.PIDs() {
		p, err := readProc(pid)
		if err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		s.server[name] = p
	}
	var err error
	s.api, err = scrapeAPIServer(ctx, sm.cp.AdminClient())
	return s, err
}

// window is what happened between two snapshots.
type window struct {
	name    string
	secs    float64
	agents  []traffic // per agent, the difference
	procs   []procStat
	cpu     []float64 // per agent, share of one core
	before  snapshot
	after   snapshot
	leader  int // index of the agent holding the taint lease, -1 if none
	churned float64
}

func diff(name string, before, after snapshot, leader int) window {
	w := window{name: name, secs: after.at.Sub(before.at).Seconds(), before: before, after: after, leader: leader, procs: after.procs}
	for i := range after.agents {
		w.agents = append(w.agents, after.agents[i].sub(before.agents[i]))
		w.cpu = append(w.cpu, (after.procs[i].CPUSecs-before.procs[i].CPUSecs)/w.secs)
	}
	return w
}

// leaderIndex is the agent whose node's agent pod holds the taint lease.
func (sm *sim) leaderIndex(ctx context.Context) int {
	l, err := sm.cp.AdminClient().CoordinationV1().Leases(agentNamespace).Get(ctx, "istio-cni-taint", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return -1
	}
	for i, a := range sm.agents {
		if daemonSetName+"-"+a.node == *l.Spec.HolderIdentity {
			return i
		}
	}
	return -1
}

// stats are the mean and maximum over the agents other than the taint leader
// (whose extra cost is shown on its own).
type stats struct{ mean, max float64 }

func (w window) over(f func(i int) float64) stats {
	var s stats
	n := 0
	for i := range w.agents {
		if i == w.leader && len(w.agents) > 1 {
			continue
		}
		v := f(i)
		s.mean += v
		s.max = math.Max(s.max, v)
		n++
	}
	if n > 0 {
		s.mean /= float64(n)
	}
	return s
}

func (s stats) String() string { return fmt.Sprintf("%.3g (max %.3g)", s.mean, s.max) }

// churner replaces pods on every node, as kubelets and controllers do: the old pod
// is deleted gracefully (deletionTimestamp set) then for good, and its replacement
// created and started; one new pod in brokenEvery starts broken (its validation
// container exited 126). Every node also reports its status once a minute. It
// keeps its place between runs.
type churner struct {
	c           kubernetes.Interface
	s           clusterSize
	brokenEvery int
	gens        []atomic.Int32 // replacements so far, per pod slot
	k           int            // the next slot, round robin over nodes
}

func newChurner(c kubernetes.Interface, s clusterSize, brokenEvery int) *churner {
	return &churner{c: c, s: s, brokenEvery: brokenEvery, gens: make([]atomic.Int32, s.Pods)}
}

// run churns at perNode replacements per second per node until ctx ends, and
// returns the replacements done.
func (ch *churner) run(ctx context.Context, perNode float64) (int64, error) {
	c, s := ch.c, ch.s
	nodes := s.nodes()
	interval := time.Duration(float64(time.Second) / (perNode * float64(nodes)))
	slots := make(chan int, 256)
	var done, errs atomic.Int64
	var firstErr atomic.Value
	var workers sync.WaitGroup
	for range 16 {
		workers.Go(func() {
			for i := range slots {
				gen := int(ch.gens[i].Add(1))
				old := workloadPod(s, i, gen-1)
				pods := c.CoreV1().Pods(old.Namespace)
				err := pods.Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](30)})
				if err == nil {
					err = pods.Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				}
				if apierrors.IsNotFound(err) {
					err = nil // the repair controller deleted it (it was broken)
				}
				if err == nil {
					err = createPod(ctx, c, workloadPod(s, i, gen), podIP(i), broken(i, gen, ch.brokenEvery))
				}
				if err != nil && ctx.Err() == nil && !strings.Contains(err.Error(), "would exceed context deadline") {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				if err == nil {
					done.Add(1)
				}
			}
		})
	}
	workers.Go(func() {
		t := time.NewTicker(time.Minute / time.Duration(nodes))
		defer t.Stop()
		for n := 0; ; n = (n + 1) % nodes {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			node, err := c.CoreV1().Nodes().Get(ctx, nodeName(n), metav1.GetOptions{})
			if err != nil {
				continue
			}
			now := metav1.NewTime(time.Now().Truncate(time.Second))
			for k := range node.Status.Conditions {
				node.Status.Conditions[k].LastHeartbeatTime = now
			}
			_, _ = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		}
	})
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			// Round robin over nodes, then over the pods of each node.
			node, slot := ch.k%nodes, (ch.k/nodes)%PodsPerNode
			if i := node*PodsPerNode + slot; i < s.Pods {
				select {
				case slots <- i:
					ch.k++
				default: // the API server is behind: the achieved rate says so
				}
			} else {
				ch.k++
			}
		}
	}
	close(slots)
	workers.Wait()
	if e := errs.Load(); e > 0 {
		return done.Load(), fmt.Errorf("%d pod replacements failed, the first: %v", e, firstErr.Load())
	}
	return done.Load(), nil
}

// broken picks one replacement in every (spread over slots and generations, so
// that the nodes with agents get their share whatever the churn's rate).
func broken(slot, gen, every int) bool {
	h := uint32(slot)*2654435761 ^ uint32(gen)*40503
	h ^= h >> 15
	return h%uint32(every) == 0
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
