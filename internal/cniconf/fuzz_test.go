package cniconf

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzInsertRemove feeds arbitrary bytes as a primary config, under each extension.
// Insert and Remove never panic nor modify their input; when Insert succeeds its
// output is valid JSON that libcni loads with our entry last, Insert on it is a
// no-op, and Remove with the input as original gives the input back byte for byte
// (the input minus stale istio-cni entries when it had some).
func FuzzInsertRemove(f *testing.F) {
	for _, in := range inputs(f) {
		data := readFile(f, in)
		f.Add(data, filepath.Ext(in) == ".conflist")
	}
	f.Add([]byte(`{"name":"x","plugins":[{"type":"istio-cni"},{"type":"ptp"},{"type":"istio-cni"}]}`), true)
	f.Add([]byte(`{"name":"x","plugins":[ {"type":"ptp"} , {"type":"a"}	]}`), true)
	f.Add([]byte(`{"name":"x","type":"bridge"}`), false)
	f.Add([]byte(`{"type":"bridge","Type":"ptp","name":"\u0078"}`), false)
	f.Add([]byte(`{"name":"x","plugins":[{"type":"ptp","TYPE":"istio-cni"}]}`), true)
	entry := testEntry(f)
	f.Fuzz(func(t *testing.T, data []byte, list bool) {
		name := "10-x.conf"
		if list {
			name = "10-x.conflist"
		}
		before := slices.Clone(data)
		out, outName, err := Insert(data, name, entry)
		if !bytes.Equal(data, before) {
			t.Fatal("Insert modified its input")
		}
		// Remove must cope with anything, too.
		_, _, _, _ = Remove(data, name, &Original{Name: name, Data: data})
		if !bytes.Equal(data, before) {
			t.Fatal("Remove modified its input")
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Insert output is not valid JSON:\n%s", out)
		}
		types := pluginTypes(t, outName, out)
		if types[len(types)-1] != PluginType || slices.Index(types, PluginType) != len(types)-1 {
			t.Fatalf("our entry is not last and alone: %v", types)
		}
		again, againName, err := Insert(out, outName, entry)
		if err != nil || againName != outName || !bytes.Equal(again, out) {
			t.Fatalf("Insert on its own output: %v\n%s\n---\n%s", err, out, again)
		}
		back, backName, changed, err := Remove(out, outName, &Original{Name: name, Data: data})
		if err != nil || !changed || backName != name {
			t.Fatalf("Remove(Insert(x)): %s changed=%v err=%v", backName, changed, err)
		}
		want := data
		if has, _ := HasType(data, name, PluginType); has {
			if want, _, _, err = Remove(data, name, nil); err != nil {
				t.Fatalf("Remove(x): %v", err)
			}
		}
		if !bytes.Equal(back, want) {
			t.Fatalf("Remove(Insert(x)) differs:\n%q\nwant\n%q", back, want)
		}
		if list {
			back, _, _, err := Remove(out, outName, nil)
			if err != nil || !bytes.Equal(back, want) {
				t.Fatalf("Remove(Insert(x)) without original: %v\n%q\nwant\n%q", err, back, want)
			}
		}
	})
}
