package kube

import (
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
