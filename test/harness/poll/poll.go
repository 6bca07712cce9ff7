// Package poll is the tests' bounded wait for a condition (the product never
// polls; its tests do, for what they cannot be told about).
package poll

import (
	"testing"
	"time"
)

// Until calls cond every interval until it holds, and fails t, naming what it
// waited for, once timeout has passed without it.
func Until(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
			return
		}
		time.Sleep(interval)
	}
}
