// Package wanterr is the tests' check that an error says what a person needs: its
// text names each field, value or reason the test wants.
package wanterr

import (
	"strings"
	"testing"
)

// Mentions fails t unless err is an error whose text holds each of want, naming
// every one that is missing. A nil err stops the test.
func Mentions(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", want)
		return // for a testing.TB whose Fatalf returns
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}
