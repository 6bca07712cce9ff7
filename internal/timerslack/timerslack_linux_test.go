package timerslack

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/root"
)

// slackOf reads a thread's timer slack.
func slackOf(t testing.TB, tid string) (uint64, bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
	if os.IsNotExist(err) {
		return 0, false // the thread ended
	}
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

func threads(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var tids []string
	for _, e := range ents {
		tids = append(tids, e.Name())
	}
	return tids
}

// restoreSlack puts every thread's slack back as it was, so the tests that
// follow run with the kernel's default.
func restoreSlack(t *testing.T) {
	before := map[string]uint64{}
	for _, tid := range threads(t) {
		if v, ok := slackOf(t, tid); ok {
			before[tid] = v
		}
	}
	t.Cleanup(func() {
		for _, tid := range threads(t) {
			v, ok := before[tid]
			if !ok {
				v = 50_000 // a thread made during the test: the kernel's default
			}
			_ = os.WriteFile("/proc/"+tid+"/timerslack_ns", []byte(strconv.FormatUint(v, 10)), 0)
		}
	})
}

// holdThread starts a goroutine that holds an OS thread of its own until stop is
// closed, and returns once it holds it.
func holdThread(stop <-chan struct{}) {
	started := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(started)
		<-stop
	}()
	<-started
}

func TestWidenSetsEveryThreadAndNewThreadsInheritIt(t *testing.T) {
	root.Require(t) // CAP_SYS_NICE, to set another thread's timer slack
	restoreSlack(t)
	// Threads that block in the kernel, so the process has several when Widen runs.
	stop := make(chan struct{})
	defer close(stop)
	for range 3 {
		holdThread(stop)
	}
	// And one that, after Widen, starts a process: the kernel gives a new thread
	// or process the slack of the thread that makes it, so the child's is the
	// widened one (the runtime's threads made later inherit theirs the same way).
	child := make(chan string)
	start := make(chan struct{})
	holding := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(holding)
		<-start
		out, err := exec.Command("cat", "/proc/self/timerslack_ns").Output()
		if err != nil {
			child <- err.Error()
			return
		}
		child <- strings.TrimSpace(string(out))
	}()
	<-holding

	const ns = 3_000_000
	before := threads(t)
	n, err := Widen(ns)
	if err != nil {
		t.Fatal(err)
	}
	// The runtime may make a thread while Widen runs, so n may exceed len(before);
	// the four holders and this goroutine's thread are at least five.
	if n < 5 {
		t.Errorf("Widen set %d threads; the process had %d before", n, len(before))
	}
	for _, tid := range before {
		if v, ok := slackOf(t, tid); ok && v != ns {
			t.Errorf("thread %s: timer slack %d, want %d", tid, v, ns)
		}
	}
	close(start)
	if got := <-child; got != strconv.Itoa(ns) {
		t.Errorf("a process started by a widened thread: timer slack %q, want %d", got, ns)
	}
}

func TestWidenRefusesZero(t *testing.T) {
	// 0 written to timerslack_ns means "the default": never what a caller wants.
	if _, err := Widen(0); err == nil {
		t.Fatal("Widen(0) returned no error")
	}
}

func BenchmarkWiden(b *testing.B) {
	for b.Loop() {
		if _, err := Widen(5_000_000); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for _, tid := range threads(b) {
		_ = os.WriteFile("/proc/"+tid+"/timerslack_ns", []byte("50000"), 0)
	}
}
