package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A side's counted lines are those outside an `import ( ... )` block that are
// not blank, a comment or lone punctuation; a listing that was cut or not read
// whole is refused.
func TestParseAndClassify(t *testing.T) {
	dir := t.TempDir()
	src := "package a\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\n" + // lines 1-7
		"// f prints.\nfunc f() {\n\tfmt.Println(os.Args)\n}\n" // lines 8-11
	if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := []byte("3 pairs of places (2 files read)\n" +
		"D1 a.go:3-6 ~ a.go:4-5\n" +
		"D2 a.go:5-11 ~ a.go:3-4 shape\n" +
		"D3 a.go:1-2 ~ x.py:1-6 shape boilerplate\n")
	pairs, err := parse(out)
	if err != nil {
		t.Fatal(err)
	}
	cache := map[string][]string{}
	var got [][2]int
	for _, p := range pairs {
		a, err := codeOutsideImports(dir, p.a, cache)
		if err != nil {
			t.Fatal(err)
		}
		b, err := codeOutsideImports(dir, p.b, cache)
		if err != nil && p.b.path != "x.py" {
			t.Fatal(err)
		}
		got = append(got, [2]int{a, b})
	}
	// D2's a side: "func f() {" and the call; the comment and "}" are not counted.
	// D3's a side: "package a".
	if diff := cmp.Diff([][2]int{{0, 0}, {2, 0}, {1, 0}}, got); diff != "" {
		t.Errorf("counted lines outside imports (-want +got):\n%s", diff)
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
