// Package envmap stands in for os.LookupEnv in tests of code that reads its
// settings from environment variables.
package envmap

import (
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// Lookup is a lookup function over the pairs name, value, name, value, ...
func Lookup(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// CheckRejected fails t unless parse, reading the variables kv (name, value,
// name, value, ...), refuses them with an error that mentions each of want.
func CheckRejected[C any](t testing.TB, parse func(lookup func(string) (string, bool)) (C, error), kv []string, want ...string) {
	t.Helper()
	_, err := parse(Lookup(kv...))
	if err == nil {
		t.Errorf("%v accepted", kv)
		return
	}
	wanterr.Mentions(t, err, want...)
}
