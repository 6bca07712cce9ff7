package jsontree

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
)

// Document parses data for a Decoder; a document Parse refuses gets encoding/json's
// own error (*json.SyntaxError), in its words: only the error path pays for it.
func Document(data []byte) (Value, error) {
	doc, err := Parse(data)
	if err != nil {
		var v any
		if stdErr := json.Unmarshal(data, &v); stdErr != nil {
			return Value{}, stdErr
		}
		return Value{}, err
	}
	return doc, nil
}

// Is says whether the JSON key names the field: exactly, or as encoding/json folds
// it (keys are matched case-insensitively when no field has the exact name).
func Is(key, field string) bool { return key == field || strings.EqualFold(key, field) }

// A Decoder stores JSON values into Go values as encoding/json.Unmarshal stores
// them, without its reflection: null leaves a value as it is and clears a pointer,
// a map or a list; an object decodes into the struct (or pointer, or map) that is
// there, so a repeated key merges; a list decodes into the elements already there,
// growing as append does; a value of the wrong kind is a type error naming its
// field path, and decoding goes on, the first such error being the one returned;
// a value that decodes itself (time.Time) and fails stops it with its error.
// Its users hold their decoders to encoding/json's results with differential
// tests and fuzz targets.
type Decoder struct {
	// Root is the decoded type's name, the type errors' Struct.
	Root    string
	err     error
	stopped bool
}

// Err is the decoding's error: the first type error, or what stopped it.
func (d *Decoder) Err() error { return d.err }

// Stop ends the decoding with err.
func (d *Decoder) Stop(err error) { d.err, d.stopped = err, true }

// TypeError records that the value v at field is not of the Go type want, as
// encoding/json words it (an integer's literal when the type cannot hold it).
func (d *Decoder) TypeError(field string, v Value, want reflect.Type) {
	if d.err != nil {
		return
	}
	got := v.Kind.String()
	switch want.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Kind == Number {
			got = "number " + string(v.Raw())
		}
	}
	d.err = &json.UnmarshalTypeError{Value: got, Type: want, Struct: d.Root, Field: field}
}

// Object calls each for the members of an object, in order, for a struct of type
// t (null: nothing; another kind: a type error).
func (d *Decoder) Object(field string, v Value, t reflect.Type, each func(key string, v Value)) {
	switch v.Kind {
	case Null:
	case Object:
		for _, m := range v.members {
			if d.stopped {
				return
			}
			each(m.Key, m.Value)
		}
	default:
		d.TypeError(field, v, t)
	}
}

// ObjectPtr is Object for a pointer to a struct: null clears it, an object
// decodes into the struct there (allocated if nil).
func ObjectPtr[T any](d *Decoder, field string, v Value, to **T, each func(s *T, key string, v Value)) {
	switch v.Kind {
	case Null:
		*to = nil
	case Object:
		if *to == nil {
			*to = new(T)
		}
		s := *to
		d.Object(field, v, reflect.TypeFor[T](), func(k string, v Value) { each(s, k, v) })
	default:
		d.TypeError(field, v, reflect.TypeFor[T]())
	}
}

// List decodes an array into *to: into the elements already there, growing it as
// append does, an empty array being a new empty slice (null: a nil slice).
func List[T any](d *Decoder, field string, v Value, to *[]T, each func(e Value, into *T)) {
	switch v.Kind {
	case Null:
		*to = nil
	case Array:
		out := *to
		var zero T
		for i, e := range v.elems {
			if d.stopped {
				return
			}
			if i >= cap(out) {
				out = append(out[:cap(out)], zero)
			}
			if i >= len(out) {
				out = out[:i+1]
			}
			each(e, &out[i])
		}
		out = out[:len(v.elems)]
		if len(out) == 0 {
			out = make([]T, 0)
		}
		*to = out
	default:
		d.TypeError(field, v, reflect.TypeFor[[]T]())
	}
}

// ListPtr is List for a pointer to a slice: null clears it.
func ListPtr[T any](d *Decoder, field string, v Value, to **[]T, each func(e Value, into *T)) {
	switch v.Kind {
	case Null:
		*to = nil
	case Array:
		if *to == nil {
			*to = new([]T)
		}
		List(d, field, v, *to, each)
	default:
		d.TypeError(field, v, reflect.TypeFor[[]T]())
	}
}

// Map decodes an object into *to, adding to the map there; each value starts
// from T's zero value.
func Map[T any](d *Decoder, field string, v Value, to *map[string]T, each func(e Value, into *T)) {
	switch v.Kind {
	case Null:
		*to = nil
	case Object:
		if *to == nil {
			*to = make(map[string]T, len(v.members))
		}
		for _, m := range v.members {
			if d.stopped {
				return
			}
			var e T
			each(m.Value, &e)
			(*to)[m.Key] = e
		}
	default:
		d.TypeError(field, v, reflect.TypeFor[map[string]T]())
	}
}

// String decodes a string.
func (d *Decoder) String(field string, v Value, to *string) {
	switch v.Kind {
	case Null:
	case String:
		*to = v.Str()
	default:
		d.TypeError(field, v, reflect.TypeFor[string]())
	}
}

// Bool decodes true or false.
func (d *Decoder) Bool(field string, v Value, to *bool) {
	switch v.Kind {
	case Null:
	case Bool:
		*to = v.BoolValue()
	default:
		d.TypeError(field, v, reflect.TypeFor[bool]())
	}
}

// Int decodes an integer that a T holds.
func Int[T int | int32 | int64](d *Decoder, field string, v Value, to *T) {
	switch v.Kind {
	case Null:
	case Number:
		n, ok := v.Int64()
		if !ok || int64(T(n)) != n {
			d.TypeError(field, v, reflect.TypeFor[T]())
			return
		}
		*to = T(n)
	default:
		d.TypeError(field, v, reflect.TypeFor[T]())
	}
}

// Uint32 decodes an integer 0 to 4294967295.
func (d *Decoder) Uint32(field string, v Value, to *uint32) {
	switch v.Kind {
	case Null:
	case Number:
		n, ok := v.Uint64()
		if !ok || n > math.MaxUint32 {
			d.TypeError(field, v, reflect.TypeFor[uint32]())
			return
		}
		*to = uint32(n)
	default:
		d.TypeError(field, v, reflect.TypeFor[uint32]())
	}
}

// Ptr decodes into a pointer: null clears it, another value decodes into what it
// points to (allocated if nil) with decode, which records its own type errors.
func Ptr[T any](v Value, to **T, decode func(into *T)) {
	if v.Kind == Null {
		*to = nil
		return
	}
	if *to == nil {
		*to = new(T)
	}
	decode(*to)
}

// StringMember is the string an object's member named key (matched as Is
// matches) stores in a string field, as encoding/json stores it: the last of
// them that is not null ("" if none). ok is false when v is not an object or one
// of those members is neither a string nor null (a type error).
func (v Value) StringMember(key string) (s string, ok bool) {
	if v.Kind != Object {
		return "", false
	}
	for _, m := range v.members {
		if !Is(m.Key, key) {
			continue
		}
		switch m.Value.Kind {
		case String:
			s = m.Value.Str()
		case Null:
		default:
			return "", false
		}
	}
	return s, true
}
