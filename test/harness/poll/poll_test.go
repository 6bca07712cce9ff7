package poll

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeTB records a Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }

func TestUntilReturnsOnceTheConditionHoldsAndFailsNamingItAfterTheBound(t *testing.T) {
	var f fakeTB
	calls := 0
	Until(&f, time.Second, time.Millisecond, "the third call", func() bool { calls++; return calls == 3 })
	if f.fatal != "" || calls != 3 {
		t.Errorf("condition true on call 3: fatal %q after %d calls", f.fatal, calls)
	}

	f = fakeTB{}
	start := time.Now()
	Until(&f, 20*time.Millisecond, time.Millisecond, "never", func() bool { return false })
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("gave up after %s, before its bound of 20ms", took)
	}
	if !strings.Contains(f.fatal, "waiting until never") || !strings.Contains(f.fatal, "20ms") {
		t.Errorf("failure %q does not name the condition and the bound", f.fatal)
	}
}
