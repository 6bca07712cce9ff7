package cniconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The scanner below only ever runs on input that encoding/json has already accepted
// as valid, so it can be small: it finds where values start and end so that edits
// are splices into the original bytes instead of a decode/encode round trip, which
// would reorder keys, reformat numbers and drop the file's layout.

// span is a half-open byte range [start, end) of a JSON value in a document.
type span struct{ start, end int }

// member is one key/value pair of a JSON object.
type member struct {
	key string // decoded, so "plugin\u0073" is "plugins" as every JSON reader sees it
	val span
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// valueEnd returns the index just past the value starting at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	default: // number, true, false, null
		for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
			i++
		}
		return i
	}
}

// stringEnd returns the index just past the string whose opening quote is b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// objectMembers lists the members of the object at s, in file order.
func objectMembers(b []byte, s span) ([]member, error) {
	var ms []member
	i := skipSpace(b, s.start+1)
	for i < s.end && b[i] == '"' {
		kEnd := stringEnd(b, i)
		key, err := decodeString(b[i:kEnd])
		if err != nil {
			return nil, fmt.Errorf("key at offset %d: %w", i, err)
		}
		i = skipSpace(b, kEnd)
		i = skipSpace(b, i+1) // past ':'
		vEnd := valueEnd(b, i)
		ms = append(ms, member{key: key, val: span{i, vEnd}})
		i = skipSpace(b, vEnd)
		if i < s.end && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return ms, nil
}

// decodeString decodes a JSON string literal; most need no unescaping.
func decodeString(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// arrayElements lists the spans of the elements of the array at s.
func arrayElements(b []byte, s span) []span {
	var es []span
	i := skipSpace(b, s.start+1)
	for i < s.end-1 && b[i] != ']' {
		end := valueEnd(b, i)
		es = append(es, span{i, end})
		i = skipSpace(b, end)
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return es
}

// kind names the JSON type of the value starting with c, for error messages.
func kind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// syntaxCheck reports whether b is one valid JSON value, with the offset of the
// first error so a person can find a truncation or a stray character.
func syntaxCheck(b []byte) error {
	if json.Valid(b) {
		return nil
	}
	var v json.RawMessage
	err := json.Unmarshal(b, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("invalid JSON at offset %d: %s", se.Offset, se.Error())
	}
	if err == nil {
		err = errors.New("not a JSON value")
	}
	return fmt.Errorf("invalid JSON: %w", err)
}
