package image

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"strings"
)

// Debian's control format (deb-control(5), the Packages index, dpkg's status
// file): stanzas of "Field: value" lines, continuation lines starting with a space
// or tab, stanzas separated by blank lines.

// controlField is one field of a stanza, its value as written (continuation lines
// joined with "\n", each keeping its leading space).
type controlField struct{ Name, Value string }

// stanza is one paragraph of a control file, its fields in their order.
type stanza []controlField

// Get returns the value of field name (case-insensitive, as dpkg reads it), or "".
func (s stanza) Get(name string) string {
	for _, f := range s {
		if strings.EqualFold(f.Name, name) {
			return f.Value
		}
	}
	return ""
}

// String writes the stanza back in control format, without the blank line after it.
func (s stanza) String() string {
	var b strings.Builder
	for _, f := range s {
		b.WriteString(f.Name)
		b.WriteString(":")
		if f.Value != "" && !strings.HasPrefix(f.Value, "\n") {
			b.WriteString(" ")
		}
		b.WriteString(f.Value)
		b.WriteString("\n")
	}
	return b.String()
}

// maxControlLine bounds one line of a control file: the longest in Debian's
// Packages index (a Description or a long Breaks list) is a few kilobytes.
const maxControlLine = 1 << 20

// parseControl reads every stanza of a control file. A line that is neither a
// field nor a continuation is an error naming its line number.
func parseControl(r io.Reader) ([]stanza, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxControlLine)
	var out []stanza
	var cur stanza
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		switch {
		case strings.TrimSpace(text) == "":
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
		case text[0] == ' ' || text[0] == '\t':
			if len(cur) == 0 {
				return nil, fmt.Errorf("control line %d: continuation line before any field: %q", line, text)
			}
			cur[len(cur)-1].Value += "\n" + text
		case strings.HasPrefix(text, "#"):
			// Comments are allowed in some control files (debian/control), never in ours.
		default:
			name, value, ok := strings.Cut(text, ":")
			if !ok || name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("control line %d: not a field: %q", line, text)
			}
			cur = append(cur, controlField{Name: name, Value: strings.TrimSpace(value)})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("control line %d: %w", line+1, err)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// compareVersions orders two Debian versions as dpkg does (deb-version(5)):
// epoch numerically, then the upstream version and the Debian revision, each
// compared in alternating runs of non-digits (letters before other characters, a
// tilde before anything, even the end) and digits (numerically).
func compareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if c := compareDigits(ea, eb); c != 0 {
		return c
	}
	if c := compareVersionPart(ua, ub); c != 0 {
		return c
	}
	return compareVersionPart(ra, rb)
}

func splitVersion(v string) (epoch, upstream, revision string) {
	epoch = "0"
	if e, rest, ok := strings.Cut(v, ":"); ok {
		epoch, v = e, rest
	}
	if i := strings.LastIndex(v, "-"); i >= 0 {
		return epoch, v[:i], v[i+1:]
	}
	return epoch, v, ""
}

// versionOrder is the weight of a non-digit character: '~' sorts before the end
// of the string, letters before every other character.
func versionOrder(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	c := s[i]
	switch {
	case c >= '0' && c <= '9':
		return 0
	case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		return int(c)
	case c == '~':
		return -1
	default:
		return int(c) + 256
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func compareVersionPart(a, b string) int {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		for (i < len(a) && !isDigit(a[i])) || (j < len(b) && !isDigit(b[j])) {
			oa, ob := versionOrder(a, i), versionOrder(b, j)
			if oa != ob {
				return cmp.Compare(oa, ob)
			}
			i++
			j++
		}
		si := i
		for i < len(a) && isDigit(a[i]) {
			i++
		}
		sj := j
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		if c := compareDigits(a[si:i], b[sj:j]); c != 0 {
			return c
		}
	}
	return 0
}

// compareDigits compares two runs of digits as numbers of any length.
func compareDigits(a, b string) int {
	a = strings.TrimLeft(a, "0")
	b = strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return cmp.Compare(len(a), len(b))
	}
	return strings.Compare(a, b)
}

// dependency is one alternative of a Depends or Pre-Depends entry: a package name
// (an architecture qualifier such as ":any" dropped: every package here is of the
// image's architecture or "all"), and an optional version relation.
type dependency struct {
	Name, Op, Version string
}

// String writes the dependency back as in a control file.
func (d dependency) String() string {
	if d.Op == "" {
		return d.Name
	}
	return fmt.Sprintf("%s (%s %s)", d.Name, d.Op, d.Version)
}

// parseDepends parses a Depends-style field: entries separated by commas, each a
// list of alternatives separated by "|".
func parseDepends(field string) ([][]dependency, error) {
	var out [][]dependency
	for _, entry := range strings.Split(strings.ReplaceAll(field, "\n", " "), ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		var alts []dependency
		for _, alt := range strings.Split(entry, "|") {
			alt = strings.TrimSpace(alt)
			// Architecture restrictions ("[amd64]") and build profiles ("<!nocheck>")
			// come last; binary packages' fields do not use them, source ones do.
			for {
				if strings.HasSuffix(alt, "]") && strings.LastIndex(alt, "[") > 0 {
					alt = strings.TrimSpace(alt[:strings.LastIndex(alt, "[")])
				} else if strings.HasSuffix(alt, ">") && strings.LastIndex(alt, "<") > 0 && !strings.HasSuffix(alt, ")") {
					alt = strings.TrimSpace(alt[:strings.LastIndex(alt, "<")])
				} else {
					break
				}
			}
			d := dependency{}
			name := alt
			if i := strings.IndexByte(alt, '('); i >= 0 {
				name = strings.TrimSpace(alt[:i])
				rel := strings.TrimSpace(alt[i+1:])
				if !strings.HasSuffix(rel, ")") {
					return nil, fmt.Errorf("dependency %q: no closing parenthesis", alt)
				}
				rel = strings.TrimSpace(strings.TrimSuffix(rel, ")"))
				for _, op := range []string{">=", "<=", ">>", "<<", "=", ">", "<"} {
					if strings.HasPrefix(rel, op) {
						d.Op, d.Version = op, strings.TrimSpace(rel[len(op):])
						break
					}
				}
				if d.Op == "" || d.Version == "" {
					return nil, fmt.Errorf("dependency %q: relation %q is not <op> <version>", alt, rel)
				}
			}
			name, _, _ = strings.Cut(name, ":")
			if name == "" {
				return nil, fmt.Errorf("dependency %q: no package name", alt)
			}
			d.Name = name
			alts = append(alts, d)
		}
		out = append(out, alts)
	}
	return out, nil
}

// satisfiedBy reports whether version meets the dependency's relation.
func (d dependency) satisfiedBy(version string) bool {
	if d.Op == "" {
		return true
	}
	c := compareVersions(version, d.Version)
	switch d.Op {
	case ">=", ">":
		return c >= 0
	case "<=", "<":
		return c <= 0
	case ">>":
		return c > 0
	case "<<":
		return c < 0
	default: // "="
		return c == 0
	}
}
