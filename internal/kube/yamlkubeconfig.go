package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/istio-cni/istio-cni/internal/jsontree"
)

// The plugin reads its kubeconfig with the YAML reader below rather than a YAML
// library: every library links regular expressions that are compiled when the
// program starts (0.2-0.3 ms of each plugin exec, on the path of every pod, the pods
// of excluded namespaces included), and a kubeconfig uses a small part of YAML.
//
// What is read: one document (an optional leading byte order mark and "---");
// block mappings and block sequences by indentation (a sequence may sit at its
// key's indentation, as kubectl writes it); plain scalars, continued on more-indented lines; single- and
// double-quoted scalars on one line; flow mappings and sequences on one line
// ({cluster: c, user: u}, [], {}); comments; JSON. What is refused, naming the line:
// anchors and aliases, tags, merge keys (<<), block scalars (| and >), multi-line
// quoted scalars and flow collections, a plain scalar continued after an empty or
// comment line, double-quoted escapes Go reads otherwise than YAML (\0-\7,
// \x80-\xff), a key repeated, tabs (in indentation or between tokens), line
// breaks other than LF and CRLF (in JSON too), content after "---" on its line,
// a second document, collections nested deeper than MaxYAMLDepth; and a file
// that is not UTF-8. Plain true/false/null are read as such, every other plain scalar as a
// string (the fields read are strings and one boolean).

// MaxYAMLDepth bounds the nesting of the collections (block and flow mappings and
// sequences, the top one included) in a kubeconfig in YAML: a deeper one is
// refused naming its line, before the reader recurses into it, so that a file of
// "[[[[" costs no deep stack (before this bound, 1 MiB of "[" grew the plugin's
// stack to 512 MiB). A kubeconfig nests at most 7 levels (the file, users, a
// user, its user, exec, exec's env, a variable). A kubeconfig in JSON keeps
// jsontree.MaxDepth.
const MaxYAMLDepth = 64

// yamlToJSON converts a kubeconfig in the YAML described above (or JSON) to JSON.
func yamlToJSON(raw []byte) ([]byte, error) {
	if !utf8.Valid(raw) {
		// YAML reads UTF-16 too, by its byte order mark, and refuses bytes that
		// are not UTF-8 (so does kubectl): neither is read as something else.
		return nil, fmt.Errorf("line %d: not UTF-8", lineOfInvalidUTF8(raw))
	}
	// One byte order mark may start the stream (YAML 1.2, 5.2); left in, it
	// would be part of the first key.
	doc := strings.TrimPrefix(string(raw), "\ufeff")
	// YAML 1.1 (kubectl's reader) breaks lines at NEL, LS and PS too, inside
	// JSON's strings as well: refused, not read as characters.
	if i := indexUnicodeLineBreak(doc); i >= 0 {
		return nil, fmt.Errorf("line %d: a line break other than LF or CRLF (NEL, LS, PS) is not supported", strings.Count(doc[:i], "\n")+1)
	}
	if text := strings.TrimLeft(doc, " \t\r\n"); strings.HasPrefix(text, "{") {
		if !json.Valid([]byte(text)) {
			return nil, fmt.Errorf("not valid JSON")
		}
		return []byte(text), nil
	}
	p := &yamlParser{}
	if err := p.lines(doc); err != nil {
		return nil, err
	}
	if len(p.ls) == 0 {
		return []byte("null"), nil
	}
	v, err := p.node(p.ls[0].indent)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.ls) {
		return nil, p.errf(p.ls[p.i].no, "unexpected indentation")
	}
	return appendJSON(nil, v)
}

// indexUnicodeLineBreak returns the index of the first NEL, LS or PS in doc, or
// -1. One search per character (each a short substring, found at memory speed),
// where strings.IndexAny of the three decodes every rune of the document: a
// kubeconfig is read on every ADD that asks the API server, and its inline CA and
// token make it a few KiB.
func indexUnicodeLineBreak(doc string) int {
	first := -1
	for _, lb := range []string{"\u0085", "\u2028", "\u2029"} {
		if i := strings.Index(doc, lb); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// lineOfInvalidUTF8 is the line of raw's first byte that is not UTF-8.
func lineOfInvalidUTF8(raw []byte) int {
	i := 0
	for i < len(raw) {
		r, n := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		i += n
	}
	return bytes.Count(raw[:i], []byte("\n")) + 1
}

// appendJSON writes the tree node builds (maps, lists, strings, booleans, null)
// as JSON, keys sorted as encoding/json sorts them, without its reflection (the
// plugin reads a kubeconfig per ADD that asks the API server).
func appendJSON(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case string:
		return jsontree.AppendString(b, v), nil
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(jsontree.AppendString(b, k), ':')
			var err error
			if b, err = appendJSON(b, v[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("yaml: a %T in the tree", v)
}

type yamlLine struct {
	no     int // 1-based line number
	indent int
	text   string // without indentation and comment
}

type yamlParser struct {
	ls []yamlLine
	i  int
	// flowDepth counts the flow collections being read: only inside one do , ] }
	// and ": " end a plain scalar.
	flowDepth int
	// depth counts the collections being read, block and flow (MaxYAMLDepth).
	depth int
}

func (p *yamlParser) errf(line int, format string, a ...any) error {
	return fmt.Errorf("line %d: %s", line, fmt.Sprintf(format, a...))
}

// enter counts a collection starting on line, refusing one nested deeper than
// MaxYAMLDepth; leave uncounts it.
func (p *yamlParser) enter(line int) error {
	if p.depth >= MaxYAMLDepth {
		return p.errf(line, "collections nested deeper than %d levels (a kubeconfig nests at most 7)", MaxYAMLDepth)
	}
	p.depth++
	return nil
}

func (p *yamlParser) leave() { p.depth-- }

// lines splits the document into lines without blank lines and comments.
func (p *yamlParser) lines(s string) error {
	seenContent := false
	for i, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.TrimSuffix(l, "\r"), "\r") {
			// YAML breaks lines there too (kubectl's reader does).
			return p.errf(i+1, "a line break other than LF or CRLF (a lone CR) is not supported")
		}
		l = strings.TrimRight(l, " \t\r")
		body := strings.TrimLeft(l, " ")
		if strings.HasPrefix(body, "\t") {
			return p.errf(i+1, "tab in indentation")
		}
		body = stripComment(body, false)
		if body == "" {
			continue
		}
		if strings.HasPrefix(body, "--- ") {
			// The document's content starts on the marker's line: not dropped.
			return p.errf(i+1, "content after --- on its line is not supported")
		}
		if body == "---" || body == "..." {
			if seenContent || body == "..." {
				return p.errf(i+1, "more than one YAML document")
			}
			continue
		}
		if strings.Contains(body, "\t") {
			// YAML separates with tabs as with spaces ("token:\tabc" is a key and
			// a value); this reader splits at spaces only.
			return p.errf(i+1, "tab in a line (only spaces are read as separators)")
		}
		if strings.HasPrefix(body, "%") {
			return p.errf(i+1, "YAML directives are not supported")
		}
		seenContent = true
		p.ls = append(p.ls, yamlLine{no: i + 1, indent: len(l) - len(strings.TrimLeft(l, " ")), text: body})
	}
	return nil
}

// stripComment removes a comment: '#' at the start or after a space, outside
// quoted scalars. A quote opens a scalar only where one starts, not inside a plain
// scalar: YAML reads `token: a "b #c"` as the token `a "b`, the rest a comment.
// plain says that s starts inside a plain scalar (a line that continues one).
func stripComment(s string, plain bool) string {
	var quote byte
	flow := 0 // flow collections open on the line: there , ] } end a plain scalar
	for i := 0; i < len(s); i++ {
		c := s[i]
		blankAfter := i+1 == len(s) || s[i+1] == ' ' || s[i+1] == '\t'
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return strings.TrimRight(s[:i], " \t")
		case c == ' ' || c == '\t':
		case !plain && (c == '"' || c == '\''):
			quote = c
		case c == ':' && (blankAfter || flow > 0 && !plain): // after a key
			plain = false
		case c == '-' && !plain && blankAfter: // a sequence entry
		case !plain && (c == '[' || c == '{'):
			flow++
		case flow > 0 && (c == ',' || c == ']' || c == '}'):
			plain = false
			if c != ',' {
				flow--
			}
		default:
			plain = true
		}
	}
	return s
}

// indexOutsideQuotes returns the first index i outside quoted scalars where at(i)
// holds, or -1. A quote opens a scalar where opens(i) holds; in double quotes a
// backslash escapes the next byte.
func indexOutsideQuotes(s string, opens, at func(i int) bool) int {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case (c == '"' || c == '\'') && opens(i):
			quote = c
		case at(i):
			return i
		}
	}
	return -1
}

// node reads the block node whose lines start at indentation indent.
func (p *yamlParser) node(indent int) (any, error) {
	l := p.ls[p.i]
	if l.text == "-" || strings.HasPrefix(l.text, "- ") {
		return p.sequence(indent)
	}
	if _, _, ok := splitKey(l.text); ok {
		return p.mapping(indent)
	}
	// A scalar on its own line(s).
	p.i++
	return p.scalarWithContinuation(l, l.text, indent-1)
}

func (p *yamlParser) sequence(indent int) (any, error) {
	if err := p.enter(p.ls[p.i].no); err != nil {
		return nil, err
	}
	defer p.leave()
	out := []any{}
	for p.i < len(p.ls) && p.ls[p.i].indent == indent && (p.ls[p.i].text == "-" || strings.HasPrefix(p.ls[p.i].text, "- ")) {
		l := p.ls[p.i]
		rest := strings.TrimLeft(strings.TrimPrefix(l.text, "-"), " ")
		if rest == "" {
			p.i++
			if p.i < len(p.ls) && p.ls[p.i].indent > indent {
				v, err := p.node(p.ls[p.i].indent)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			} else {
				out = append(out, nil)
			}
			continue
		}
		// "- key: value ...": the item's content starts at the column after "- ".
		col := indent + len(l.text) - len(rest)
		p.ls[p.i] = yamlLine{no: l.no, indent: col, text: rest}
		v, err := p.node(col)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (p *yamlParser) mapping(indent int) (any, error) {
	if err := p.enter(p.ls[p.i].no); err != nil {
		return nil, err
	}
	defer p.leave()
	out := map[string]any{}
	for p.i < len(p.ls) && p.ls[p.i].indent == indent {
		l := p.ls[p.i]
		k, v, ok := splitKey(l.text)
		if !ok {
			return nil, p.errf(l.no, "expected \"key: value\"")
		}
		key, err := p.scalar(l.no, k)
		if err != nil {
			return nil, err
		}
		ks, err := p.key(out, l.no, key)
		if err != nil {
			return nil, err
		}
		p.i++
		switch {
		case v != "":
			out[ks], err = p.scalarWithContinuation(l, v, indent)
		case p.i < len(p.ls) && (p.ls[p.i].indent > indent ||
			(p.ls[p.i].indent == indent && (p.ls[p.i].text == "-" || strings.HasPrefix(p.ls[p.i].text, "- ")))):
			out[ks], err = p.node(p.ls[p.i].indent)
		default:
			out[ks] = nil
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// key is the key k of a mapping read into out, as a string. A key already in out
// is refused, in a block or a flow mapping: the YAML library keeps the last, and
// reads {token: t, token:} as a token t and the key "token:" (YAML 1.1).
func (p *yamlParser) key(out map[string]any, line int, k any) (string, error) {
	ks, ok := k.(string)
	if !ok {
		ks = fmt.Sprint(k)
	}
	if ks == "<<" {
		// YAML 1.1's merge key: the library merges the mapping under it into
		// this one (<<: {token: t} is a token).
		return "", p.errf(line, "YAML merge keys (<<) are not supported")
	}
	if _, dup := out[ks]; dup {
		return "", p.errf(line, "key %q repeated", ks)
	}
	return ks, nil
}

// splitKey splits "key: value" (or "key:") at the first ": " outside quotes; a
// line that starts a flow collection is no key.
func splitKey(s string) (key, value string, ok bool) {
	if strings.HasPrefix(s, "{") || strings.HasPrefix(s, "[") {
		return "", "", false
	}
	at := indexOutsideQuotes(s, func(i int) bool { return i == 0 },
		func(i int) bool { return s[i] == ':' && (i+1 == len(s) || s[i+1] == ' ') })
	if at < 0 {
		return "", "", false
	}
	return strings.TrimSpace(s[:at]), strings.TrimSpace(s[at+1:]), true
}

// scalarWithContinuation reads the value v of line l, with the more-indented lines
// that continue a plain scalar (folded with spaces).
func (p *yamlParser) scalarWithContinuation(l yamlLine, v string, indent int) (any, error) {
	plain := v[0] != '"' && v[0] != '\'' && v[0] != '{' && v[0] != '['
	end := p.i
	for end < len(p.ls) && p.ls[end].indent > indent {
		if !plain {
			return nil, p.errf(p.ls[end].no, "a quoted scalar or flow collection continued on another line is not supported")
		}
		if p.ls[end].no != p.ls[end-1].no+1 {
			// An empty or comment line was left out before it. YAML keeps an
			// empty line in a plain scalar as a line break (and a comment line
			// ends the scalar): not read as a space.
			return nil, p.errf(p.ls[end].no, "a plain scalar continued after an empty or comment line is not supported")
		}
		end++
	}
	if end > p.i {
		// Joined once: joining line by line would copy the scalar once per line.
		n := len(v)
		for _, c := range p.ls[p.i:end] {
			n += 1 + len(c.text)
		}
		var b strings.Builder
		b.Grow(n)
		b.WriteString(v)
		for _, c := range p.ls[p.i:end] {
			// Inside the scalar a quote is text: a comment it seemed to hold
			// is one (what else differs is a ": " in the line, which YAML
			// refuses in a plain scalar).
			b.WriteByte(' ')
			b.WriteString(stripComment(c.text, true))
		}
		v, p.i = b.String(), end
	}
	return p.scalar(l.no, v)
}

// scalar reads a scalar or a one-line flow collection.
func (p *yamlParser) scalar(line int, s string) (any, error) {
	v, rest, err := p.flow(line, s)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(rest) != "" {
		// Named, not quoted: the line may hold a token or a key, and the plugin's
		// errors reach the pod's events.
		return nil, p.errf(line, "unexpected text after the value")
	}
	return v, nil
}

// flow reads one value at the start of s, inside a flow collection or not, and
// returns what follows it.
func (p *yamlParser) flow(line int, s string) (any, string, error) {
	s = strings.TrimLeft(s, " ")
	if s == "" {
		return nil, "", nil
	}
	switch s[0] {
	case '&', '*':
		return nil, "", p.errf(line, "YAML anchors and aliases are not supported")
	case '!':
		return nil, "", p.errf(line, "YAML tags are not supported")
	case '|', '>':
		return nil, "", p.errf(line, "YAML block scalars (| and >) are not supported")
	case '"':
		end := 1
		for ; end < len(s) && s[end] != '"'; end++ {
			if s[end] == '\\' {
				end++
			}
		}
		if end >= len(s) {
			return nil, "", p.errf(line, "unterminated double-quoted scalar (one line only)")
		}
		// strconv.Unquote reads Go's escapes, which YAML's mostly are; not Go's
		// octal \101, and Go's \xe9 is a byte where YAML's is a code point (é).
		for i := 1; i < end; i++ {
			if s[i] == '\\' {
				if i++; s[i] >= '0' && s[i] <= '7' || s[i] == 'x' && !strings.ContainsRune("01234567", rune(s[i+1])) {
					return nil, "", p.errf(line, "double-quoted scalar with an escape YAML reads otherwise than Go (\\0-\\7, \\x80-\\xff)")
				}
			}
		}
		v, err := strconv.Unquote(s[:end+1])
		if err != nil {
			return nil, "", p.errf(line, "double-quoted scalar with an escape or character it cannot hold: %v", err)
		}
		return v, s[end+1:], nil
	case '\'':
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				return b.String(), s[i+1:], nil
			}
			b.WriteByte(s[i])
		}
		return nil, "", p.errf(line, "unterminated single-quoted scalar (one line only)")
	case '[':
		if err := p.enter(line); err != nil {
			return nil, "", err
		}
		defer p.leave()
		p.flowDepth++
		defer func() { p.flowDepth-- }()
		out := []any{}
		rest := strings.TrimLeft(s[1:], " ")
		for !strings.HasPrefix(rest, "]") {
			v, r, err := p.flow(line, rest)
			if err != nil {
				return nil, "", err
			}
			out = append(out, v)
			if rest, err = p.flowNext(line, r, ']'); err != nil {
				return nil, "", err
			}
		}
		return out, rest[1:], nil
	case '{':
		if err := p.enter(line); err != nil {
			return nil, "", err
		}
		defer p.leave()
		p.flowDepth++
		defer func() { p.flowDepth-- }()
		out := map[string]any{}
		rest := strings.TrimLeft(s[1:], " ")
		for !strings.HasPrefix(rest, "}") {
			k, r, err := p.flow(line, rest)
			if err != nil {
				return nil, "", err
			}
			r = strings.TrimLeft(r, " ")
			var v any
			if strings.HasPrefix(r, ":") {
				if v, r, err = p.flow(line, r[1:]); err != nil {
					return nil, "", err
				}
			}
			ks, err := p.key(out, line, k)
			if err != nil {
				return nil, "", err
			}
			out[ks] = v
			if rest, err = p.flowNext(line, r, '}'); err != nil {
				return nil, "", err
			}
		}
		return out, rest[1:], nil
	}
	// A plain scalar: up to the end, or inside a flow collection up to , ] } or ": ".
	end := len(s)
	if p.flowDepth > 0 {
		if i := strings.IndexAny(s, ",]}"); i >= 0 {
			end = i
		}
		if i := strings.Index(s[:end], ": "); i >= 0 {
			end = i
		}
		if strings.HasSuffix(s[:end], ":") {
			end--
		}
	}
	v := strings.TrimSpace(s[:end])
	switch v {
	case "true", "True", "TRUE":
		return true, s[end:], nil
	case "false", "False", "FALSE":
		return false, s[end:], nil
	case "null", "Null", "NULL", "~", "":
		return nil, s[end:], nil
	}
	return v, s[end:], nil
}

// flowNext skips the separator after an item of a flow collection closed by end,
// leaving the rest at the next item or at end.
func (p *yamlParser) flowNext(line int, r string, end byte) (string, error) {
	r = strings.TrimLeft(r, " ")
	switch {
	case strings.HasPrefix(r, ","):
		return strings.TrimLeft(r[1:], " "), nil
	case len(r) > 0 && r[0] == end:
		return r, nil
	}
	return "", p.errf(line, "flow collection: expected ',' or '%c' (one line only)", end)
}
