// Command dupcount runs `duplicates --most 200` over the checkout and counts the
// pairs it lists, split into Go import lists (a side has fewer than six counted
// lines outside an `import ( ... )` block: the tool says it passes import lines
// over but does not recognise them inside Go's grouped form, so two files that need
// the same packages list them alike and make a pair) and the others, of which it also counts those the tool marks boilerplate. It is
// how the figures in docs/architecture.md ("Repeated code kept on purpose") are
// measured; -v lists the pairs under their kind.
//
//	go run ./hack/dupcount [-v] [DIR]
//
// The `duplicates` command must be on PATH. Its listing is cut at 200 rows (its
// own maximum); dupcount fails when the tool says pairs were cut or not read.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// row is one pair of the listing: "D7 a.go:13-20 ~ b.go:11-18 shape boilerplate".
var row = regexp.MustCompile(`^D\d+ (\S+):(\d+)-(\d+) ~ (\S+):(\d+)-(\d+)(.*)$`)

type side struct {
	path        string
	first, last int
}

type pair struct {
	line string
	a, b side
	tail string
	kind string
}

func main() {
	verbose := flag.Bool("v", false, "list the pairs under their kind")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	if err := run(dir, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "dupcount:", err)
		os.Exit(1)
	}
}

func run(dir string, verbose bool) error {
	cmd := exec.Command("duplicates", "--most", "200", "--seconds", "120")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("run duplicates in %s: %w", dir, err)
	}
	pairs, err := parse(out)
	if err != nil {
		return err
	}
	lines := map[string][]string{}
	counts := map[string]int{}
	boilerplate := 0
	for i := range pairs {
		p := &pairs[i]
		codeA, err := codeOutsideImports(dir, p.a, lines)
		if err != nil {
			return err
		}
		codeB, err := codeOutsideImports(dir, p.b, lines)
		if err != nil {
			return err
		}
		p.kind = "other"
		if min(codeA, codeB) < minLines {
			p.kind = "import list"
		} else if strings.Contains(p.tail, "boilerplate") {
			boilerplate++
		}
		counts[p.kind]++
	}
	fmt.Printf("%d pairs: %d import lists, %d others (%d of those marked boilerplate)\n",
		len(pairs), counts["import list"], counts["other"], boilerplate)
	if verbose {
		for _, kind := range []string{"import list", "other"} {
			fmt.Printf("\n%s:\n", kind)
			for _, p := range pairs {
				if p.kind == kind {
					fmt.Println("  " + p.line)
				}
			}
		}
	}
	return nil
}

// parse reads the rows of a listing and fails on a listing that is not whole.
func parse(out []byte) ([]pair, error) {
	var pairs []pair
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "incomplete:") || strings.HasPrefix(line, "(+") && strings.HasSuffix(line, "more pairs)") {
			return nil, fmt.Errorf("the listing is not whole: %s", line)
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		p := pair{line: line, tail: m[7]}
		p.a = side{path: m[1], first: atoi(m[2]), last: atoi(m[3])}
		p.b = side{path: m[4], first: atoi(m[5]), last: atoi(m[6])}
		pairs = append(pairs, p)
	}
	return pairs, nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s) // the pattern admits only digits
	return n
}

// minLines is the tool's default run length: a pair shares at least this many
// counted lines.
const minLines = 6

// codeOutsideImports counts the lines of s that the tool says it counts (not
// blank, not a comment, not lone punctuation, not an import line) and that lie
// outside a Go file's grouped import block. The tool does not see the lines inside
// `import ( ... )` as import lines; a side with fewer than minLines such lines is a
// pair only through its import list.
func codeOutsideImports(dir string, s side, cache map[string][]string) (int, error) {
	lines, ok := cache[s.path]
	if !ok {
		data, err := os.ReadFile(filepath.Join(dir, s.path))
		if err != nil {
			return 0, fmt.Errorf("read a listed file: %w", err)
		}
		lines = strings.Split(string(data), "\n")
		cache[s.path] = lines
	}
	goFile := filepath.Ext(s.path) == ".go"
	in := false
	code := 0
	for n, l := range lines {
		t := strings.TrimSpace(l)
		inside := in
		switch {
		case goFile && t == "import (":
			in, inside = true, true
		case in && t == ")":
			in = false
		}
		if n+1 < s.first || n+1 > s.last || inside {
			continue
		}
		if t == "" || strings.HasPrefix(t, "//") || strings.HasPrefix(t, "import ") || strings.Trim(t, "{}()[],;") == "" {
			continue
		}
		code++
	}
	return code, nil
}
