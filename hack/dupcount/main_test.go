package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A row's sides are import lists only when every line of both lies in an
// `import ( ... )` block; a listing that was cut or not read whole is refused.
func TestParseAndClassify(t *testing.T) {
	dir := t.TempDir()
	src := "package a\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc f() {\n\tfmt.Println(os.Args)\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := []byte("3 pairs of places (2 files read)\n" +
		"D1 a.go:3-6 ~ a.go:4-5\n" +
		"D2 a.go:5-8 ~ a.go:3-4 shape\n" +
		"D3 a.go:1-2 ~ x.py:1-6 shape boilerplate\n")
	pairs, err := parse(out)
	if err != nil {
		t.Fatal(err)
	}
	cache := map[string][]string{}
	var got []bool
	for _, p := range pairs {
		a, err := inImports(dir, p.a, cache)
		if err != nil {
			t.Fatal(err)
		}
		b, err := inImports(dir, p.b, cache)
		if err != nil && p.b.path != "x.py" {
			t.Fatal(err)
		}
		got = append(got, a && b)
	}
	if diff := cmp.Diff([]bool{true, false, false}, got); diff != "" {
		t.Errorf("import-list verdicts (-want +got):\n%s", diff)
	}
	if pairs[2].tail != " shape boilerplate" {
		t.Errorf("tail of D3 = %q", pairs[2].tail)
	}
	for _, cut := range []string{"(+12 more pairs)", "incomplete: time: 2 files not read"} {
		if _, err := parse([]byte("D1 a.go:3-6 ~ a.go:4-5\n" + cut + "\n")); err == nil {
			t.Errorf("a listing ending %q was taken as whole", cut)
		}
	}
}
