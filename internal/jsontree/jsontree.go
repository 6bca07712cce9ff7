// Package jsontree reads a JSON document into a tree of values without
// reflection, for the plugin's per-pod hot path: encoding/json's first decode in
// a process builds its reflection caches for every type it meets, which cost the
// plugin more (about 0.2 ms) than everything else it does for a pod it passes
// through. A tree keeps each value's bytes as written (Raw), so a part of the
// document can be passed on byte for byte.
//
// It accepts exactly what encoding/json accepts (json.Valid), up to the same
// nesting depth, and decodes strings as encoding/json does (invalid UTF-8 and
// lone surrogates become U+FFFD): TestParseAgreesWithEncodingJSON and
// FuzzParseAgreesWithEncodingJSON hold it to that.
package jsontree

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is a JSON value's type.
type Kind uint8

const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// String is the kind's name as encoding/json's type errors write it.
func (k Kind) String() string {
	return [...]string{"null", "bool", "number", "string", "array", "object"}[k]
}

// MaxDepth is the deepest nesting Parse accepts: encoding/json's.
const MaxDepth = 10000

// Value is one JSON value.
type Value struct {
	Kind    Kind
	raw     []byte   // the value's bytes in the document
	members []Member // Object, in document order (duplicates kept)
	elems   []Value  // Array
	escaped bool     // String: has a backslash or a byte that needs decoding
}

// Member is one key and value of an object.
type Member struct {
	Key   string
	Value Value
}

// Raw is the value's bytes as they are in the document (a sub-slice of it).
func (v Value) Raw() []byte { return v.raw }

// Members are an object's members in document order; nil for other kinds.
func (v Value) Members() []Member { return v.members }

// Elems are an array's elements; nil for other kinds.
func (v Value) Elems() []Value { return v.elems }

// Str is a string's decoded text.
func (v Value) Str() string {
	if !v.escaped {
		return string(v.raw[1 : len(v.raw)-1])
	}
	return unquote(v.raw)
}

// BoolValue is a bool's value.
func (v Value) BoolValue() bool { return len(v.raw) == 4 }

// Int64 is a number's value as an integer: false when it has a fraction or an
// exponent, or does not fit (encoding/json refuses those for an integer too).
func (v Value) Int64() (int64, bool) {
	n, err := strconv.ParseInt(string(v.raw), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// Uint64 is a number's value as a non-negative integer (see Int64).
func (v Value) Uint64() (uint64, bool) {
	n, err := strconv.ParseUint(string(v.raw), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// SyntaxError is a document that is not JSON.
type SyntaxError struct {
	Offset int // the byte at which reading stopped
	msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("%s at byte %d", e.msg, e.Offset) }

// Parse reads data, which must hold one JSON value and nothing but white space
// around it.
func Parse(data []byte) (Value, error) {
	p := parser{data: data}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return Value{}, err
	}
	p.space()
	if p.i != len(data) {
		return Value{}, p.fail("invalid character %s after top-level value")
	}
	return v, nil
}

type parser struct {
	data []byte
	i    int
}

func (p *parser) fail(format string) error {
	what := "end of input"
	if p.i < len(p.data) {
		what = strconv.QuoteRune(rune(p.data[p.i]))
		if c := p.data[p.i]; c >= utf8.RuneSelf {
			what = fmt.Sprintf("byte %#x", c)
		}
	}
	return &SyntaxError{Offset: p.i, msg: fmt.Sprintf(format, what)}
}

func (p *parser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (Value, error) {
	if p.i >= len(p.data) {
		return Value{}, p.fail("unexpected %s looking for a value")
	}
	start := p.i
	switch c := p.data[p.i]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		escaped, err := p.str()
		if err != nil {
			return Value{}, err
		}
		return Value{Kind: String, raw: p.data[start:p.i], escaped: escaped}, nil
	case c == '-' || c >= '0' && c <= '9':
		if err := p.number(); err != nil {
			return Value{}, err
		}
		return Value{Kind: Number, raw: p.data[start:p.i]}, nil
	case c == 't':
		return p.literal("true", Bool)
	case c == 'f':
		return p.literal("false", Bool)
	case c == 'n':
		return p.literal("null", Null)
	}
	return Value{}, p.fail("invalid character %s looking for a value")
}

func (p *parser) literal(word string, k Kind) (Value, error) {
	start := p.i
	for j := 0; j < len(word); j++ {
		if p.i >= len(p.data) || p.data[p.i] != word[j] {
			return Value{}, p.fail("invalid character %s in literal " + word)
		}
		p.i++
	}
	return Value{Kind: k, raw: p.data[start:p.i]}, nil
}

func (p *parser) object(depth int) (Value, error) {
	if depth > MaxDepth {
		return Value{}, p.fail("exceeded max depth at %s")
	}
	start := p.i
	p.i++ // {
	v := Value{Kind: Object}
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		v.raw = p.data[start:p.i]
		v.members = []Member{}
		return v, nil
	}
	for {
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return Value{}, p.fail("unexpected %s looking for the beginning of an object key string")
		}
		keyStart := p.i
		escaped, err := p.str()
		if err != nil {
			return Value{}, err
		}
		key := Value{Kind: String, raw: p.data[keyStart:p.i], escaped: escaped}
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return Value{}, p.fail("unexpected %s after object key")
		}
		p.i++
		p.space()
		val, err := p.value(depth)
		if err != nil {
			return Value{}, err
		}
		v.members = append(v.members, Member{Key: key.Str(), Value: val})
		p.space()
		if p.i >= len(p.data) {
			return Value{}, p.fail("unexpected %s after object key:value pair")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
			p.space()
			continue
		case '}':
			p.i++
			v.raw = p.data[start:p.i]
			return v, nil
		}
		return Value{}, p.fail("invalid character %s after object key:value pair")
	}
}

func (p *parser) array(depth int) (Value, error) {
	if depth > MaxDepth {
		return Value{}, p.fail("exceeded max depth at %s")
	}
	start := p.i
	p.i++ // [
	v := Value{Kind: Array, elems: []Value{}}
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		v.raw = p.data[start:p.i]
		return v, nil
	}
	for {
		e, err := p.value(depth)
		if err != nil {
			return Value{}, err
		}
		v.elems = append(v.elems, e)
		p.space()
		if p.i >= len(p.data) {
			return Value{}, p.fail("unexpected %s after array element")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
			p.space()
			continue
		case ']':
			p.i++
			v.raw = p.data[start:p.i]
			return v, nil
		}
		return Value{}, p.fail("invalid character %s after array element")
	}
}

// str reads a string; escaped says whether decoding it needs more than slicing
// (an escape, a byte over 0x7f that may be invalid UTF-8).
func (p *parser) str() (escaped bool, err error) {
	p.i++ // "
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			p.i++
			if p.i >= len(p.data) {
				return false, p.fail("unexpected %s in string escape code")
			}
			switch p.data[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i++
			case 'u':
				p.i++
				for j := 0; j < 4; j++ {
					if p.i >= len(p.data) || !isHex(p.data[p.i]) {
						return false, p.fail("invalid character %s in \\u hexadecimal character escape")
					}
					p.i++
				}
			default:
				return false, p.fail("invalid character %s in string escape code")
			}
		case c < 0x20:
			return false, p.fail("invalid character %s in string literal")
		default:
			if c >= utf8.RuneSelf {
				escaped = true
			}
			p.i++
		}
	}
	return false, p.fail("unexpected %s in string literal")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) number() error {
	if p.data[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.data) && p.data[p.i] == '0':
		p.i++
	case p.i < len(p.data) && isDigit(p.data[p.i]):
		for p.i < len(p.data) && isDigit(p.data[p.i]) {
			p.i++
		}
	default:
		return p.fail("invalid character %s in numeric literal")
	}
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		if p.i >= len(p.data) || !isDigit(p.data[p.i]) {
			return p.fail("invalid character %s after decimal point in numeric literal")
		}
		for p.i < len(p.data) && isDigit(p.data[p.i]) {
			p.i++
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if p.i >= len(p.data) || !isDigit(p.data[p.i]) {
			return p.fail("invalid character %s in exponent of numeric literal")
		}
		for p.i < len(p.data) && isDigit(p.data[p.i]) {
			p.i++
		}
	}
	return nil
}

// unquote decodes a string the parser accepted, as encoding/json does.
func unquote(raw []byte) string {
	s := raw[1 : len(raw)-1]
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			i++
			switch s[i] {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := hex4(s[i+1 : i+5])
				i += 5 // past uXXXX
				if utf16.IsSurrogate(r) {
					// A pair is one rune; a lone half is U+FFFD.
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if pair := utf16.DecodeRune(r, hex4(s[i+2:i+6])); pair != utf8.RuneError {
							out = utf8.AppendRune(out, pair)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // " \ /
				out = append(out, s[i])
			}
			i++
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, s[i:i+size]...)
			}
			i += size
		}
	}
	return string(out)
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// AppendString appends s to dst as a JSON string, for writers of small documents
// that stay clear of encoding/json's reflection as readers do with Parse: quotes,
// backslashes and control characters escaped, U+2028 and U+2029 too (as
// encoding/json does), invalid UTF-8 written as U+FFFD (what encoding/json both
// writes and reads for it).
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		// A run of bytes written as they are goes in with one append (a
		// kubeconfig's inline CA and token are kilobytes of them).
		j := i
		for j < len(s) && s[j] >= 0x20 && s[j] < utf8.RuneSelf && s[j] != '"' && s[j] != '\\' {
			j++
		}
		if j > i {
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
