package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// The figures are measured once per test binary, whatever b.N is, and printed; they
// assert nothing.

var reinsertOnce struct {
	sync.Once
	took []time.Duration
	err  error
}

// BenchmarkReinsertAfterThePrimaryRewritesItsConfig measures the time from the primary
// CNI replacing its config without our entry (write a temporary file, rename, as CNI
// daemons do) to our entry being back, over 100 rewrites. The benchmark waits with
// fsnotify rather than polling, so it does not steal the agent's CPU.
func BenchmarkReinsertAfterThePrimaryRewritesItsConfig(b *testing.B) {
	const rewrites = 100
	reinsertOnce.Do(func() {
		n := newNode(b)
		path := n.writeCalico(b)
		p := n.startAgent(b, "REVERT_WARN_COUNT=1000")
		p.waitReady(b)
		w, err := fsnotify.NewWatcher()
		if err != nil {
			reinsertOnce.err = err
			return
		}
		defer w.Close()
		if err := w.Add(n.confDir); err != nil {
			reinsertOnce.err = err
			return
		}
		for range rewrites {
			time.Sleep(20 * time.Millisecond) // the agent is at rest when the rewrite comes
			drain(w)
			start := time.Now()
			writeLikeACNI(b, path, []byte(calicoConflist))
			deadline := time.After(5 * time.Second)
			for !hasEntryLast(path) {
				select {
				case <-w.Events:
				case <-deadline:
					reinsertOnce.err = fmt.Errorf("entry not back within 5s")
					return
				}
			}
			reinsertOnce.took = append(reinsertOnce.took, time.Since(start))
		}
		p.stop(b)
	})
	if reinsertOnce.err != nil {
		b.Fatal(reinsertOnce.err)
	}
	for range b.N {
	}
	took := slices.Clone(reinsertOnce.took)
	slices.Sort(took)
	p50, p99, maxT := took[len(took)/2], took[len(took)*99/100-1], took[len(took)-1]
	b.ReportMetric(ms(p50), "ms-p50")
	b.ReportMetric(ms(p99), "ms-p99")
	b.ReportMetric(ms(maxT), "ms-max")
	b.Logf("entry back after the primary's rewrite, %d rewrites: p50 %v, p99 %v, max %v", len(took), p50, p99, maxT)
}

func drain(w *fsnotify.Watcher) {
	for {
		select {
		case <-w.Events:
		default:
			return
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var idleOnce struct {
	sync.Once
	rssKiB, cpuPct, switches float64
	err                      error
}

// BenchmarkAgentAtRest measures the agent's resident memory once installed and its
// CPU and context switches over 10 s with nothing changing (goal: no polling).
func BenchmarkAgentAtRest(b *testing.B) {
	const window = 10 * time.Second
	idleOnce.Do(func() {
		n := newNode(b)
		n.writeCalico(b)
		p := n.startAgent(b)
		p.waitReady(b)
		time.Sleep(time.Second) // past start-up
		pid := p.cmd.Process.Pid
		cpu0, sw0, err := cpuAndSwitches(pid)
		if err != nil {
			idleOnce.err = err
			return
		}
		time.Sleep(window)
		cpu1, sw1, err := cpuAndSwitches(pid)
		if err != nil {
			idleOnce.err = err
			return
		}
		rss, err := statusField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
		if err != nil {
			idleOnce.err = err
			return
		}
		idleOnce.rssKiB = rss
		idleOnce.cpuPct = 100 * (cpu1 - cpu0).Seconds() / window.Seconds()
		idleOnce.switches = sw1 - sw0
		p.stop(b)
	})
	if idleOnce.err != nil {
		b.Fatal(idleOnce.err)
	}
	for range b.N {
	}
	b.ReportMetric(idleOnce.rssKiB, "KiB-RSS")
	b.ReportMetric(idleOnce.cpuPct, "%CPU-idle")
	b.ReportMetric(idleOnce.switches, "ctxsw/10s")
	b.Logf("at rest: RSS %.0f KiB, CPU %.3f%% over %s, %.0f context switches (all threads)", idleOnce.rssKiB, idleOnce.cpuPct, window, idleOnce.switches)
}

// cpuAndSwitches reads a process's user+system time and the context switches of all
// its threads.
func cpuAndSwitches(pid int) (time.Duration, float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the ")" that ends the command name; utime and stime are 14 and 15.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	const clockTicks = 100 // USER_HZ on Linux
	cpu := time.Duration((utime + stime) / clockTicks * float64(time.Second))
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var sw float64
	for _, t := range tasks {
		v, _ := statusField(t, "voluntary_ctxt_switches")
		nv, _ := statusField(t, "nonvoluntary_ctxt_switches")
		sw += v + nv
	}
	return cpu, sw, nil
}

func statusField(path, name string) (float64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			return strconv.ParseFloat(strings.Fields(rest)[0], 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, name)
}
