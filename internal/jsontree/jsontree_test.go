package jsontree

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// toAny is v as encoding/json decodes into an any with UseNumber: objects as maps
// (a later duplicate key wins), numbers as json.Number.
func toAny(v Value) any {
	switch v.Kind {
	case Null:
		return nil
	case Bool:
		return v.BoolValue()
	case Number:
		return json.Number(v.Raw())
	case String:
		return v.Str()
	case Array:
		out := []any{}
		for _, e := range v.Elems() {
			out = append(out, toAny(e))
		}
		return out
	}
	out := map[string]any{}
	for _, m := range v.Members() {
		out[m.Key] = toAny(m.Value)
	}
	return out
}

func decodeStd(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// agree fails t unless Parse and encoding/json agree on data: both accept it or
// both refuse it, and an accepted document decodes to the same value, its Raw
// included.
func agree(t *testing.T, data []byte) {
	t.Helper()
	v, err := Parse(data)
	if valid := json.Valid(data); (err == nil) != valid {
		t.Fatalf("%q: Parse error %v, json.Valid %v", data, err, valid)
	}
	if err != nil {
		return
	}
	want, err := decodeStd(data)
	if err != nil {
		t.Fatalf("%q: encoding/json: %v", data, err)
	}
	if diff := cmp.Diff(want, toAny(v)); diff != "" {
		t.Fatalf("%q decodes differently (-encoding/json +Parse):\n%s", data, diff)
	}
	if !bytes.Equal(bytes.TrimSpace(data), v.Raw()) {
		t.Fatalf("%q: Raw is %q, want the document without its surrounding space", data, v.Raw())
	}
}

var corpus = []string{
	`null`, `true`, `false`, ` 0 `, `-0`, `1`, `-12.5e+3`, `1E9`, `0.1`, `123456789012345678901234567890`,
	`""`, `"a"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\ud83dx"`,
	`"\ud83d\u0041"`, `"\ud83d\ud83d\ude00"`, "\"\xff\"", "\"\xe9t\xc3\xa9\"", "\"\xed\xa0\x80\"", "\"caf\xc3\xa9\"",
	`[]`, `[1,2,[3,[4]]]`, `{}`, `{"a":1,"b":[true,false,null],"c":{"d":"e"}}`, `{"a":1,"a":2}`,
	`{"a" : 1 , "b" : [ ] }`, "\t\n\r {\"k\":\"v\"}\n",
	`{"cniVersion":"1.1.0","name":"k8s","type":"istio-cni","prevResult":{"ips":[{"address":"10.0.0.2/24"}]}}`,
	// refused
	``, ` `, `nul`, `tru`, `falsey`, `01`, `-`, `1.`, `.1`, `1e`, `1e+`, `+1`, `0x10`, `NaN`, `Infinity`,
	`"`, `"abc`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01\"", "\"tab\there\"", `[`, `[1,]`, `[,1]`, `[1 2]`, `{`, `{"a"}`, `{"a":}`,
	`{"a":1,}`, `{a:1}`, `{"a":1 "b":2}`, `{1:2}`, `1 2`, `[] []`, `{"a":1}}`, `'a'`, "\xef\xbb\xbf{}", `"a"x`,
}

func TestParseAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range corpus {
		agree(t, []byte(c))
	}
}

func TestParseNestingLimitIsEncodingJSONs(t *testing.T) {
	for _, depth := range []int{MaxDepth, MaxDepth + 1} {
		for _, doc := range []string{
			strings.Repeat("[", depth) + strings.Repeat("]", depth),
			strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth),
		} {
			// Validity only: comparing values this deep is slow and adds nothing.
			_, err := Parse([]byte(doc))
			if valid := json.Valid([]byte(doc)); (err == nil) != valid || (err == nil) != (depth <= MaxDepth) {
				t.Errorf("depth %d: Parse error %v, json.Valid %v", depth, err, valid)
			}
		}
	}
}

func TestSyntaxErrorSaysWhereAndWhat(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a":1,}`, `unexpected '}' looking for the beginning of an object key string at byte 7`},
		{`[1,2`, `unexpected end of input after array element at byte 4`},
		{"\"a\x01\"", `invalid character '\x01' in string literal at byte 2`},
		{`{"a":1} x`, `invalid character 'x' after top-level value at byte 8`},
		{"\xff", `invalid character byte 0xff looking for a value at byte 0`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || err.Error() != tc.want {
			t.Errorf("Parse(%q) = %v, want %s", tc.in, err, tc.want)
		}
	}
}

func TestNumbersAsIntegers(t *testing.T) {
	for _, tc := range []struct {
		in  string
		i   int64
		iok bool
		u   uint64
		uok bool
	}{
		{"0", 0, true, 0, true},
		{"-1", -1, true, 0, false},
		{"4294967295", 4294967295, true, 4294967295, true},
		{"1.5", 0, false, 0, false},
		{"1e3", 0, false, 0, false},
		{"99999999999999999999", 0, false, 0, false},
	} {
		v, err := Parse([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		i, iok := v.Int64()
		u, uok := v.Uint64()
		if i != tc.i || iok != tc.iok || u != tc.u || uok != tc.uok {
			t.Errorf("%s: Int64 %d %v, Uint64 %d %v; want %d %v, %d %v", tc.in, i, iok, u, uok, tc.i, tc.iok, tc.u, tc.uok)
		}
	}
}

func FuzzParseAgreesWithEncodingJSON(f *testing.F) {
	for _, c := range corpus {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree(t, data) })
}

// quotedAgrees fails t unless AppendString(s) is a JSON string that Parse and
// encoding/json both read as what encoding/json writes for s.
func quotedAgrees(t *testing.T, s string) {
	t.Helper()
	out := AppendString(nil, s)
	var std, fromStd string
	if err := json.Unmarshal(out, &std); err != nil {
		t.Fatalf("%q: AppendString wrote %s, not JSON: %v", s, out, err)
	}
	marshalled, _ := json.Marshal(s)
	if err := json.Unmarshal(marshalled, &fromStd); err != nil {
		t.Fatal(err)
	}
	if std != fromStd {
		t.Fatalf("%q: AppendString's %s reads as %q, encoding/json's %s as %q", s, out, std, marshalled, fromStd)
	}
	v, err := Parse(out)
	if err != nil || v.Str() != std {
		t.Fatalf("%q: Parse reads %s as %q (%v), want %q", s, out, v.Str(), err, std)
	}
}

var quoteCorpus = []string{"", "plain", `quote " and \ backslash`, "nl\ncr\rtab\tnul\x00esc\x1b", "caf\u00e9 \u4e2d \U0001F600",
	"\u2028\u2029", "bad \xff utf8 \xe9x", "<html>&amp;", "\x7f"}

func TestAppendStringWritesWhatEncodingJSONReadsBack(t *testing.T) {
	for _, s := range quoteCorpus {
		quotedAgrees(t, s)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range quoteCorpus {
		f.Add(s)
	}
	f.Fuzz(quotedAgrees)
}

func TestStringMemberStoresAsEncodingJSON(t *testing.T) {
	for _, doc := range []string{
		`{"name":"a"}`, `{}`, `{"NAME":"b"}`, `{"name":"a","name":"b"}`, `{"name":"a","name":null}`,
		`{"name":null}`, `{"name":1}`, `{"name":"a","Name":true}`, `[]`, `"name"`, `{"other":1,"nAmE":"c"}`,
	} {
		v, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := v.StringMember("name")
		var want struct {
			Name string `json:"name"`
		}
		stdErr := json.Unmarshal([]byte(doc), &want)
		if ok != (stdErr == nil) || ok && got != want.Name {
			t.Errorf("%s: StringMember = %q, %v; encoding/json %q, %v", doc, got, ok, want.Name, stdErr)
		}
	}
}
