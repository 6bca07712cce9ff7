package kube

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestAContinuedScalarIsParsedInLinearTime: a plain scalar continued over many
// lines is joined once, not by one concatenation per line (quadratic: a 1 MiB
// kubeconfig took 22 s). Work is measured by bytes allocated, which does not
// depend on the machine's load: joined line by line, the 32,768 lines below
// allocate about 2 GiB; joined once, a few MiB.
func TestAContinuedScalarIsParsedInLinearTime(t *testing.T) {
	const lines = 32 << 10
	doc := "token: a\n" + strings.Repeat("  a\n", lines)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	js, err := yamlToJSON([]byte(doc))
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"token":"a` + strings.Repeat(" a", lines) + `"}`; string(js) != want {
		t.Errorf("got %.80s... (%d bytes), want %.80s... (%d bytes)", js, len(js), want, len(want))
	}
	if allocated, bound := after.TotalAlloc-before.TotalAlloc, 64*uint64(len(doc)); allocated > bound {
		t.Errorf("a %d-byte scalar of %d lines allocated %d MiB to read, more than %d MiB", len(doc), lines+1, allocated>>20, bound>>20)
	}
}

// TestNestingDeeperThanMaxYAMLDepthIsRefused: collections nested up to
// MaxYAMLDepth levels (the top mapping counts as one) are read; one level more is
// refused naming the line and the limit, before the reader recurses further, so
// that a file of "[[[[" costs no deep stack. Flow and block collections count
// alike.
func TestNestingDeeperThanMaxYAMLDepthIsRefused(t *testing.T) {
	// Each builds a document of n nested collections, the innermost on line
	// line(n).
	cases := []struct {
		name string
		doc  func(n int) string
		line func(n int) int
	}{
		{"flow sequences",
			func(n int) string {
				return "apiVersion: v1\npreferences: " + strings.Repeat("[", n-1) + strings.Repeat("]", n-1) + "\n"
			},
			func(int) int { return 2 }},
		{"flow mappings",
			func(n int) string {
				return "apiVersion: v1\npreferences: " + strings.Repeat("{a: ", n-1) + "x" + strings.Repeat("}", n-1) + "\n"
			},
			func(int) int { return 2 }},
		{"block sequences on one line",
			func(n int) string { return "apiVersion: v1\npreferences:\n" + strings.Repeat("- ", n-1) + "x\n" },
			func(int) int { return 3 }},
		{"block mappings",
			func(n int) string {
				var b strings.Builder
				for i := range n {
					fmt.Fprintf(&b, "%sa:\n", strings.Repeat("  ", i))
				}
				return b.String()
			},
			func(n int) int { return n }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			js, err := yamlToJSON([]byte(c.doc(MaxYAMLDepth)))
			if err != nil {
				t.Fatalf("%d levels: %v", MaxYAMLDepth, err)
			}
			if depth := jsonDepth(t, js); depth != MaxYAMLDepth {
				t.Fatalf("%d levels read as JSON nested %d levels: %.200s", MaxYAMLDepth, depth, js)
			}
			_, err = yamlToJSON([]byte(c.doc(MaxYAMLDepth + 1)))
			want := fmt.Sprintf("line %d: collections nested deeper than %d levels", c.line(MaxYAMLDepth+1), MaxYAMLDepth)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%d levels: got %v, want an error with %q", MaxYAMLDepth+1, err, want)
			}
		})
	}
	t.Run("a whole kubeconfig of [", func(t *testing.T) {
		n := (MaxFileBytes - 100) / 2
		raw := "apiVersion: v1\npreferences: " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n"
		_, err := ParseKubeconfig([]byte(raw), "/")
		want := fmt.Sprintf("line 2: collections nested deeper than %d levels", MaxYAMLDepth)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a %d-byte kubeconfig nested %d levels: got %.200v, want an error with %q", len(raw), n+1, err, want)
		}
	})
}

// jsonDepth is the nesting of the JSON js: 1 for a flat object.
func jsonDepth(t *testing.T, js []byte) int {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(js)))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}
