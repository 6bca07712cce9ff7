package cniconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testEntry(t testing.TB) []byte { return readFile(t, "testdata/entry.json") }

// inputs lists the real-world primary configs in testdata/in.
func inputs(t testing.TB) []string {
	t.Helper()
	ins, err := filepath.Glob("testdata/in/*")
	if err != nil || len(ins) == 0 {
		t.Fatalf("no inputs in testdata/in: %v", err)
	}
	return ins
}

// pluginTypes loads a config as the runtime does and lists its plugins' types.
func pluginTypes(t testing.TB, name string, data []byte) []string {
	t.Helper()
	var l *libcni.NetworkConfigList
	var err error
	if filepath.Ext(name) == ".conflist" {
		l, err = libcni.NetworkConfFromBytes(data)
	} else {
		var c *libcni.PluginConfig
		if c, err = libcni.NetworkPluginConfFromBytes(data); err == nil {
			l, err = libcni.ConfListFromConf(c)
		}
	}
	if err != nil {
		t.Fatalf("libcni refuses %s: %v\n%s", name, err, data)
	}
	var types []string
	for _, p := range l.Plugins {
		types = append(types, p.Network.Type)
	}
	return types
}

// decodedPlugins returns each plugin of a config decoded, for comparing meaning.
func decodedPlugins(t testing.TB, name string, data []byte) []any {
	t.Helper()
	var top map[string]any
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	if filepath.Ext(name) != ".conflist" {
		return []any{top}
	}
	return top["plugins"].([]any)
}

// TestInsertGoldenAndRemoveRestoresInput runs every real-world config through
// Insert (golden output), checks the output loads with our entry last and every
// other plugin intact, that Insert is idempotent, and that Remove gives back the
// input byte for byte under its own name.
func TestInsertGoldenAndRemoveRestoresInput(t *testing.T) {
	entry := testEntry(t)
	for _, in := range inputs(t) {
		name := filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			existing := readFile(t, in)
			out, outName, err := Insert(existing, name, entry)
			if err != nil {
				t.Fatalf("Insert: %v", err)
			}
			wantName := name
			if filepath.Ext(name) != ".conflist" {
				wantName = strings.TrimSuffix(name, filepath.Ext(name)) + ".conflist"
			}
			if outName != wantName {
				t.Errorf("Insert wrote %s, want %s", outName, wantName)
			}
			golden.Check(t, filepath.Join("testdata/out", outName), out)

			// Meaning: the runtime sees the input's plugins (minus any old istio-cni),
			// unchanged, then ours.
			inTypes := pluginTypes(t, name, existing)
			wantTypes := append(slices.DeleteFunc(slices.Clone(inTypes), func(s string) bool { return s == PluginType }), PluginType)
			if diff := cmp.Diff(wantTypes, pluginTypes(t, outName, out)); diff != "" {
				t.Errorf("plugin types (-want +got):\n%s", diff)
			}
			inPlugins := decodedPlugins(t, name, existing)
			outPlugins := decodedPlugins(t, outName, out)
			var kept []any
			for i, p := range inPlugins {
				if inTypes[i] != PluginType {
					kept = append(kept, p)
				}
			}
			if diff := cmp.Diff(kept, outPlugins[:len(outPlugins)-1]); diff != "" {
				t.Errorf("other plugins changed (-in +out):\n%s", diff)
			}
			var wantEntry any
			if err := json.Unmarshal(entry, &wantEntry); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantEntry, outPlugins[len(outPlugins)-1]); diff != "" {
				t.Errorf("our entry (-want +got):\n%s", diff)
			}

			again, againName, err := Insert(out, outName, entry)
			if err != nil || againName != outName || !bytes.Equal(again, out) {
				t.Errorf("Insert on its own output is not a no-op: name %s, err %v, diff:\n%s", againName, err, cmp.Diff(string(out), string(again)))
			}

			back, backName, changed, err := Remove(out, outName, &Original{Name: name, Data: existing})
			if err != nil || !changed {
				t.Fatalf("Remove: changed %v, err %v", changed, err)
			}
			want, _, _, err := Remove(existing, name, nil) // the input without any old istio-cni entry
			if err != nil {
				t.Fatal(err)
			}
			if backName != name || !bytes.Equal(back, want) {
				t.Errorf("Remove after Insert gave %s, want %s byte for byte (-want +got):\n%s", backName, name, cmp.Diff(string(want), string(back)))
			}
			if !slices.Contains(inTypes, PluginType) && !bytes.Equal(back, existing) {
				t.Errorf("Remove after Insert does not give back the input byte for byte")
			}
			if filepath.Ext(name) == ".conflist" {
				// Without the backup the splice alone restores a list.
				back, _, _, err := Remove(out, outName, nil)
				if err != nil || !bytes.Equal(back, want) {
					t.Errorf("Remove without original: err %v (-want +got):\n%s", err, cmp.Diff(string(want), string(back)))
				}
			}
		})
	}
}

// keyPaths lists every object key of a JSON document in order, with its path, read
// by encoding/json's tokenizer: independent of the splicing under test.
func keyPaths(t testing.TB, data []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	var paths []string
	type frame struct {
		path    string
		isObj   bool
		idx     int
		wantKey bool
		key     string
	}
	var stack []*frame
	child := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := stack[len(stack)-1]
		if f.isObj {
			return f.path + "." + f.key
		}
		p := fmt.Sprintf("%s[%d]", f.path, f.idx)
		return p
	}
	afterValue := func() {
		if len(stack) == 0 {
			return
		}
		f := stack[len(stack)-1]
		if f.isObj {
			f.wantKey = true
		} else {
			f.idx++
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if len(stack) > 0 && stack[len(stack)-1].isObj && stack[len(stack)-1].wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				afterValue()
				continue
			}
			f := stack[len(stack)-1]
			f.key = tok.(string)
			f.wantKey = false
			paths = append(paths, f.path+"."+f.key)
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{path: child(), isObj: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{path: child()})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			afterValue()
		default:
			afterValue()
		}
	}
	return paths
}

// TestInsertKeepsKeyOrderAndUnknownKeys compares every key, in order, of the input
// and the output of a list: all of them survive in place, unknown ones included.
func TestInsertKeepsKeyOrderAndUnknownKeys(t *testing.T) {
	entry := testEntry(t)
	for _, in := range inputs(t) {
		name := filepath.Base(in)
		if filepath.Ext(name) != ".conflist" || name == "legacy-istio.conflist" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			existing := readFile(t, in)
			out, _, err := Insert(existing, name, entry)
			if err != nil {
				t.Fatal(err)
			}
			n := len(pluginTypes(t, name, existing))
			ours := fmt.Sprintf(".plugins[%d].", n)
			var got []string
			for _, p := range keyPaths(t, out) {
				if !strings.HasPrefix(p, ours) {
					got = append(got, p)
				}
			}
			if diff := cmp.Diff(keyPaths(t, existing), got); diff != "" {
				t.Errorf("keys (-in +out):\n%s", diff)
			}
		})
	}
}

// TestInsertWrapKeepsOriginalKeyOrder checks a wrapped .conf keeps its keys in
// order as the first plugin.
func TestInsertWrapKeepsOriginalKeyOrder(t *testing.T) {
	existing := readFile(t, "testdata/in/multus.conf")
	out, _, err := Insert(existing, "00-multus.conf", testEntry(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range keyPaths(t, out) {
		if rest, ok := strings.CutPrefix(p, ".plugins[0]"); ok {
			got = append(got, rest)
		}
	}
	if diff := cmp.Diff(keyPaths(t, existing), got); diff != "" {
		t.Errorf("keys (-in +out):\n%s", diff)
	}
}

// TestInvalidConfigIsRefusedUntouched feeds broken and unusable configs to Insert
// and Remove: each is refused with an error naming the file and the problem, and
// the input slice is not modified.
func TestInvalidConfigIsRefusedUntouched(t *testing.T) {
	calico := readFile(t, "testdata/in/calico.conflist")
	huge := append([]byte(`{"name":"x","pad":"`), bytes.Repeat([]byte("a"), MaxConfigSize)...)
	huge = append(huge, `","plugins":[{"type":"ptp"}]}`...)
	tests := []struct {
		name    string
		file    string
		data    []byte
		wantErr string
	}{
		{"truncated", "10-calico.conflist", calico[:120], fmt.Sprintf("10-calico.conflist: invalid JSON at offset %d: unexpected end of JSON input", 120)},
		{"half written", "10-calico.conflist", calico[:len(calico)/2], fmt.Sprintf("10-calico.conflist: invalid JSON at offset %d: unexpected end of JSON input", len(calico)/2)},
		{"not JSON", "10-x.conflist", []byte("hello: world\n"), "10-x.conflist: invalid JSON at offset 1: invalid character 'h' looking for beginning of value"},
		{"trailing garbage", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":"ptp"}]} }`), "10-x.conflist: invalid JSON at offset 41: invalid character '}' after top-level value"},
		{"empty file", "10-x.conflist", nil, "10-x.conflist: empty file"},
		{"only whitespace", "10-x.conflist", []byte("\n\n"), "10-x.conflist: invalid JSON at offset 2: unexpected end of JSON input"},
		{"huge file", "10-x.conflist", huge, fmt.Sprintf("10-x.conflist: %d bytes, more than the %d a CNI config may have", len(huge), MaxConfigSize)},
		{"top level list", "10-x.conflist", []byte(`[{"type":"ptp"}]`), "10-x.conflist: top level is a list, not an object"},
		{"plugins not a list", "10-x.conflist", []byte(`{"name":"x","plugins":{"type":"ptp"}}`), `10-x.conflist: "plugins" is not a list (it is an object)`},
		{"plugins missing", "10-x.conflist", []byte(`{"name":"x"}`), `10-x.conflist: no "plugins" list`},
		{"single plugin named conflist", "10-x.conflist", []byte(`{"name":"x","type":"bridge"}`), `10-x.conflist: no "plugins" list: this is a single plugin config, name it .conf`},
		{"plugins twice", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":"a"}],"plugins":[{"type":"b"}]}`), `10-x.conflist: key "plugins" appears 2 times`},
		{"plugins empty", "10-x.conflist", []byte(`{"name":"x","plugins":[]}`), `10-x.conflist: "plugins" is empty`},
		{"plugin not an object", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":"a"},"b"]}`), `10-x.conflist: plugins[1] is a string, not an object`},
		{"plugin without type", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":"a"},{"mtu":1}]}`), `10-x.conflist: plugins[1]: no "type"`},
		{"type not a string", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":7}]}`), `10-x.conflist: plugins[0]: "type" is not a string (it is a number)`},
		{"type empty", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":""}]}`), `10-x.conflist: plugins[0]: "type" is empty`},
		{"no name", "10-x.conflist", []byte(`{"plugins":[{"type":"a"}]}`), `10-x.conflist: no "name"`},
		{"name not a string", "10-x.conflist", []byte(`{"name":1,"plugins":[{"type":"a"}]}`), `10-x.conflist: "name" is not a string (it is a number)`},
		{"libcni refuses", "10-x.conflist", []byte(`{"name":"x","disableCheck":"maybe","plugins":[{"type":"a"}]}`), `10-x.conflist: not a CNI config list libcni accepts: error parsing configuration list: invalid value "maybe" for disableCheck`},
		{"only istio-cni", "10-x.conflist", []byte(`{"name":"x","plugins":[{"type":"istio-cni"}]}`), `10-x.conflist: holds only istio-cni entries: it is not a primary network`},
		{"conf without type", "10-x.conf", []byte(`{"name":"x","plugins":[{"type":"a"}]}`), `10-x.conf: no "type": this is a plugin list, name it .conflist`},
		{"conf is ours", "10-x.conf", []byte(`{"name":"x","type":"istio-cni"}`), `10-x.conf: is istio-cni's own config, not a primary network`},
		{"truncated conf", "10-flannel.conf", []byte(`{"name":"cbr0","type":"flan`), "10-flannel.conf: invalid JSON at offset 27: unexpected end of JSON input"},
		{"other extension", "10-x.yaml", []byte(`{"name":"x","type":"bridge"}`), `10-x.yaml: extension ".yaml" is not one the runtime loads (.conf, .conflist, .json)`},
	}
	entry := testEntry(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.data)
			out, outName, err := Insert(tt.data, tt.file, entry)
			if err == nil {
				t.Fatalf("Insert accepted it and returned %s:\n%s", outName, out)
			}
			if got := err.Error(); got != tt.wantErr {
				t.Errorf("Insert error:\n got %s\nwant %s", got, tt.wantErr)
			}
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.File != tt.file {
				t.Errorf("Insert error %T does not name file %s", err, tt.file)
			}
			if out != nil || !bytes.Equal(tt.data, before) {
				t.Errorf("Insert returned bytes or changed its input")
			}
			if _, _, _, err := Remove(tt.data, tt.file, nil); err == nil && !strings.Contains(tt.name, "istio") && !strings.Contains(tt.name, "ours") {
				t.Errorf("Remove accepted it")
			}
			if !bytes.Equal(tt.data, before) {
				t.Errorf("Remove changed its input")
			}
		})
	}
}

// TestInsertRejectsBadEntry: the entry comes from a user's template, so a broken one
// is named as such.
func TestInsertRejectsBadEntry(t *testing.T) {
	calico := readFile(t, "testdata/in/calico.conflist")
	tests := []struct{ entry, wantErr string }{
		{`{"type": "istio-cni",`, "istio-cni entry: invalid JSON at offset 21: unexpected end of JSON input"},
		{`{"name": "istio-cni"}`, `istio-cni entry: no "type"`},
		{`["istio-cni"]`, "istio-cni entry: top level is a list, not an object"},
		{``, "istio-cni entry: empty file"},
	}
	for _, tt := range tests {
		_, _, err := Insert(calico, "10-calico.conflist", []byte(tt.entry))
		if err == nil || err.Error() != tt.wantErr {
			t.Errorf("Insert with entry %q: got %v, want %s", tt.entry, err, tt.wantErr)
		}
	}
}

// TestRemove covers Remove beyond the round trip: nothing to remove, a primary that
// rewrote its file since, a wrapped .conf edited since, and our own file.
func TestRemove(t *testing.T) {
	entry := testEntry(t)
	flannel := readFile(t, "testdata/in/flannel.conflist")
	flannelOld := readFile(t, "testdata/in/flannel-old.conf")
	withUs, _, err := Insert(flannel, "10-flannel.conflist", entry)
	if err != nil {
		t.Fatal(err)
	}
	wrapped, _, err := Insert(flannelOld, "10-flannel.conf", entry)
	if err != nil {
		t.Fatal(err)
	}
	// The primary rewrote its list (a new MTU) and we re-inserted into it.
	rewritten := bytes.Replace(flannel, []byte(`"hairpinMode": true`), []byte(`"hairpinMode": true, "mtu": 1450`), 1)
	withUsRewritten, _, err := Insert(rewritten, "10-flannel.conflist", entry)
	if err != nil {
		t.Fatal(err)
	}
	// Someone edited the wrapped list by hand after we wrote it.
	edited := bytes.Replace(wrapped, []byte(`"name": "cbr0",`), []byte(`"name": "cbr0", "disableCheck": true,`), 1)

	tests := []struct {
		name        string
		file        string
		data        []byte
		original    *Original
		want        []byte
		wantName    string
		wantChanged bool
	}{
		{"nothing of ours", "10-flannel.conflist", flannel, nil, flannel, "10-flannel.conflist", false},
		{"a .conf is never ours to change", "10-flannel.conf", flannelOld, nil, flannelOld, "10-flannel.conf", false},
		{"primary rewrote its file: its new version stays", "10-flannel.conflist", withUsRewritten, &Original{"10-flannel.conflist", flannel}, rewritten, "10-flannel.conflist", true},
		{"wrapped .conf comes back", "10-flannel.conflist", wrapped, &Original{"10-flannel.conf", flannelOld}, flannelOld, "10-flannel.conf", true},
		{"wrapped then edited: the edit stays, in the list", "10-flannel.conflist", edited, &Original{"10-flannel.conf", flannelOld}, edited[:bytes.LastIndex(edited, []byte(",\n    {\n      \"cniVersion\""))], "", true},
		{"backup of another file is not used", "10-flannel.conflist", withUs, &Original{"10-flannel.conf", flannelOld}, flannel, "10-flannel.conflist", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, gotName, changed, err := Remove(tt.data, tt.file, tt.original)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantName == "" { // only a prefix is known: the rest must be the untouched tail
				tt.wantName = tt.file
				if !bytes.HasPrefix(got, tt.want) || slices.Contains(pluginTypes(t, gotName, got), PluginType) {
					t.Fatalf("got\n%s", got)
				}
				tt.want = got
			}
			if gotName != tt.wantName || changed != tt.wantChanged {
				t.Errorf("got %s changed=%v, want %s changed=%v", gotName, changed, tt.wantName, tt.wantChanged)
			}
			if diff := cmp.Diff(string(tt.want), string(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}

	if _, _, _, err := Remove([]byte(`{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`), "YYY-istio-cni.conf", nil); err == nil ||
		err.Error() != "YYY-istio-cni.conf: is istio-cni's own config: delete the file instead" {
		t.Errorf("Remove on our standalone file: %v", err)
	}
}

// TestStandalone: the file for Multus/OpenShift mode loads with libcni as one
// istio-cni plugin, with the version and name given and the entry's keys in order.
func TestStandalone(t *testing.T) {
	out, err := Standalone(testEntry(t), "1.0.0", "istio-cni")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "testdata/out/standalone.conf", out)
	c, err := libcni.NetworkPluginConfFromBytes(out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Network.Type != PluginType || c.Network.CNIVersion != "1.0.0" || c.Network.Name != "istio-cni" {
		t.Errorf("loaded as %+v", c.Network)
	}
	kept, err := Standalone(testEntry(t), "", "")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(kept, &got); err != nil || got["cniVersion"] != "0.3.1" || got["name"] != "istio-cni" {
		t.Errorf("empty arguments should keep the entry's own values: %s", kept)
	}
	if _, err := Standalone([]byte(`{"name":"x"}`), "1.0.0", "x"); err == nil || err.Error() != `istio-cni entry: no "type"` {
		t.Errorf("entry without type: %v", err)
	}
}

func BenchmarkInsertCalico(b *testing.B) {
	existing := readFile(b, "testdata/in/calico.conflist")
	entry := testEntry(b)
	b.SetBytes(int64(len(existing)))
	for b.Loop() {
		if _, _, err := Insert(existing, "10-calico.conflist", entry); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRemoveCalico(b *testing.B) {
	existing := readFile(b, "testdata/in/calico.conflist")
	out, _, err := Insert(existing, "10-calico.conflist", testEntry(b))
	if err != nil {
		b.Fatal(err)
	}
	orig := &Original{Name: "10-calico.conflist", Data: existing}
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if _, _, _, err := Remove(out, "10-calico.conflist", orig); err != nil {
			b.Fatal(err)
		}
	}
}
