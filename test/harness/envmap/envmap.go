// Package envmap stands in for os.LookupEnv in tests of code that reads its
// settings from environment variables.
package envmap

// Lookup is a lookup function over the pairs name, value, name, value, ...
func Lookup(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}
