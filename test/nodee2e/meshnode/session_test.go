package meshnode

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// TestExecFailedTellsAFailedRequestFromAFailedExec: proxy-standin get's exit
// status for a failed request (3), as kubectl exec passes it on, is the request's
// failure; any other exit status is the exec's (kubectl's own errors exit 1); an
// error without an exit status (a wrong answer, a pod without an IP) is neither.
func TestExecFailedTellsAFailedRequestFromAFailedExec(t *testing.T) {
	run := func(code int) error {
		err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run()
		return fmt.Errorf("kubectl exec ...: %w", err) // wrapped, as Sh and requestThroughProxies do
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"request failed", run(exitRequestFailed), false},
		{"kubectl failed", run(1), true},
		{"killed", run(137), true},
		{"no error", nil, false},
		{"a wrong answer", errors.New(`answer "x": want the app's name`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExecFailed(tc.err); got != tc.want {
				t.Errorf("ExecFailed(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestOutputTailQuotesTheEndOfAFailedCommandsOutput: Sh's error carries the
// command's output (a session whose output is discarded still says why a command
// failed), a long one only by its last outputTailMax bytes.
func TestOutputTailQuotesTheEndOfAFailedCommandsOutput(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
	}{
		{"none", "", ""},
		{"blank", " \n", ""},
		{"short", "proxy-standin: GET http://x/: connection refused\n", "; output: proxy-standin: GET http://x/: connection refused"},
		{"long", strings.Repeat("a", 5000) + "END\n", "; output: ..." + strings.Repeat("a", outputTailMax-3) + "END"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outputTail([]byte(tc.out)); got != tc.want {
				t.Errorf("outputTail = %.80q... (%d bytes), want %.80q... (%d bytes)", got, len(got), tc.want, len(tc.want))
			}
		})
	}
}
