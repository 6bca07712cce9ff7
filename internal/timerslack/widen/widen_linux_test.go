package widen

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/root"
)

// The test binary imports the package, so its init ran before this test: every
// thread of the process has the slack, those of the init's time and those made
// since, which inherit it.
func TestInitWidenedEveryThread(t *testing.T) {
	root.Require(t) // CAP_SYS_NICE, to set another thread's timer slack
	if Err != nil || Threads < 2 {
		t.Fatalf("at init: %d threads set, error %v; want the runtime's threads and no error", Threads, Err)
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/timerslack_ns")
		if err != nil {
			continue // the thread ended
		}
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil || v != Slack {
			t.Errorf("thread %s: timer slack %q, want %d", e.Name(), strings.TrimSpace(string(b)), Slack)
		}
	}
}
