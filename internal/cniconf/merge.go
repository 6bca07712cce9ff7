package cniconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// Original is a primary config as it was before we first inserted our entry: its
// file name and its exact bytes. The agent keeps it in BackupPath.
type Original struct {
	Name string
	Data []byte
}

// Insert puts entry, a JSON object with a "type", last in the plugin chain of the
// config existing read from filename, and returns the new bytes and the file name
// they belong under.
//
// In a .conflist, entries of the same type as entry are taken out wherever they are
// and entry is appended, so Insert on its own output returns the same bytes. Every
// other byte of the file is kept: the edit is a splice inside the "plugins" array,
// and entry is laid out in the indentation of the plugins around it.
//
// A .conf or .json holds a single plugin, which cannot chain; it is wrapped into a
// list {cniVersion, name, plugins: [original, entry]} to be written as NAME.conflist.
// The original object is kept inside it byte for byte (only re-indented).
//
// A config the runtime would not load, or one holding nothing but entries of our
// type, is refused with an *InvalidError.
func Insert(existing []byte, filename string, entry []byte) (out []byte, outName string, err error) {
	ent, typ, err := parseEntry(entry)
	if err != nil {
		return nil, "", err
	}
	switch ext := filepath.Ext(filename); ext {
	case ".conflist":
		return insertList(existing, filename, ent, typ)
	case ".conf", ".json":
		return wrap(existing, filename, ent, typ)
	default:
		return nil, "", invalid(filename, "extension %q is not one the runtime loads (.conf, .conflist, .json)", ext)
	}
}

func insertList(existing []byte, filename string, ent []byte, typ string) ([]byte, string, error) {
	l, err := parseList(filename, existing)
	if err != nil {
		return nil, "", err
	}
	out, elems := without(l, typ)
	if len(elems) == 0 {
		return nil, "", invalid(filename, "holds only %s entries: it is not a primary network", typ)
	}
	// Lay our entry out like the plugin before it: the separator between the last two
	// plugins, or the whitespace after '[' when there is only one.
	var sep []byte
	if n := len(elems); n >= 2 {
		sep = out[elems[n-2].end:elems[n-1].start]
	} else {
		sep = append([]byte{','}, out[l.plugins.start+1:elems[0].start]...)
	}
	var formatted []byte
	if nl := bytes.LastIndexByte(sep, '\n'); nl >= 0 {
		formatted = indent(ent, string(sep[nl+1:]), detectIndent(out), bytes.Contains(sep, []byte("\r\n")))
	} else {
		formatted = ent
	}
	at := elems[len(elems)-1].end
	res := make([]byte, 0, len(out)+len(sep)+len(formatted))
	res = append(res, out[:at]...)
	res = append(res, sep...)
	res = append(res, formatted...)
	res = append(res, out[at:]...)
	return res, filename, nil
}

// without returns a copy of l's bytes with every plugin of type typ spliced out,
// with the spans of the plugins left. A plugin takes the separator before it along
// (after it, for the first), so taking out what insertList appended restores the
// bytes exactly.
func without(l *list, typ string) ([]byte, []span) {
	out := slices.Clone(l.data)
	es := slices.Clone(l.elems)
	for i := len(es) - 1; i >= 0; i-- {
		if l.types[i] != typ {
			continue
		}
		var cut span
		switch {
		case i > 0:
			cut = span{es[i-1].end, es[i].end}
		case len(es) > 1:
			cut = span{es[0].start, es[1].start}
		default:
			cut = es[0]
		}
		out = append(out[:cut.start], out[cut.end:]...)
		es = slices.Delete(es, i, i+1)
		n := cut.end - cut.start
		for j := i; j < len(es); j++ {
			es[j].start -= n
			es[j].end -= n
		}
	}
	return out, es
}

// wrap turns a single-plugin config into a list ending with our entry.
func wrap(existing []byte, filename string, ent []byte, typ string) ([]byte, string, error) {
	d, t, err := parseSingle(filename, existing)
	if err != nil {
		return nil, "", err
	}
	if t == typ {
		return nil, "", invalid(filename, "is %s's own config, not a primary network", typ)
	}
	name := []byte(`"k8s-pod-network"`) // libcni lets a .conf go without a name; a list needs one
	if ns := d.lookup("name"); len(ns) > 0 {
		name = d.bytes(ns[len(ns)-1].val)
	}
	var version []byte
	if vs := d.lookup("cniVersion"); len(vs) > 0 {
		version = d.bytes(vs[len(vs)-1].val)
	}
	obj := d.bytes(d.root)
	nl := "\n"
	crlf := bytes.Contains(existing, []byte("\r\n"))
	if crlf {
		nl = "\r\n"
	}
	var b bytes.Buffer
	b.Grow(len(existing)*2 + len(ent)*2)
	if bytes.IndexByte(obj, '\n') < 0 {
		b.WriteString("{")
		if version != nil {
			b.WriteString(`"cniVersion":`)
			b.Write(version)
			b.WriteString(",")
		}
		b.WriteString(`"name":`)
		b.Write(name)
		b.WriteString(`,"plugins":[`)
		b.Write(obj)
		b.WriteString(",")
		b.Write(ent)
		b.WriteString("]}")
	} else {
		unit := detectIndent(existing)
		inner := unit + unit
		b.WriteString("{" + nl)
		if version != nil {
			b.WriteString(unit + `"cniVersion": `)
			b.Write(version)
			b.WriteString("," + nl)
		}
		b.WriteString(unit + `"name": `)
		b.Write(name)
		b.WriteString("," + nl + unit + `"plugins": [` + nl + inner)
		b.Write(bytes.ReplaceAll(obj, []byte("\n"), []byte("\n"+inner)))
		b.WriteString("," + nl + inner)
		b.Write(indent(ent, inner, unit, crlf))
		b.WriteString(nl + unit + "]" + nl + "}")
	}
	b.Write(existing[d.root.end:]) // whatever followed the object, usually a newline
	return b.Bytes(), strings.TrimSuffix(filename, filepath.Ext(filename)) + ".conflist", nil
}

// indent lays out a compact JSON value whose first line starts at column prefix.
func indent(compact []byte, prefix, unit string, crlf bool) []byte {
	var b bytes.Buffer
	b.Grow(len(compact) * 2)
	// compact came out of json.Compact, so Indent cannot fail.
	_ = json.Indent(&b, compact, prefix, unit)
	if crlf {
		return bytes.ReplaceAll(b.Bytes(), []byte("\n"), []byte("\r\n"))
	}
	return b.Bytes()
}

// detectIndent returns the indentation of the first indented line: the file's unit.
func detectIndent(b []byte) string {
	for i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b); {
		j := i + 1
		for j < len(b) && (b[j] == ' ' || b[j] == '\t') {
			j++
		}
		if j > i+1 && j < len(b) && b[j] != '\n' && b[j] != '\r' {
			return string(b[i+1 : j])
		}
		k := bytes.IndexByte(b[i+1:], '\n')
		if k < 0 {
			break
		}
		i += 1 + k
	}
	return "  "
}

// Remove takes every istio-cni entry out of the config existing read from filename.
// See RemoveType.
func Remove(existing []byte, filename string, original *Original) (out []byte, outName string, changed bool, err error) {
	return RemoveType(existing, filename, original, PluginType)
}

// RemoveType takes every plugin of type typ out of the config existing read from
// filename, and returns the bytes to write, the file name they belong under, and
// whether anything changed.
//
// When original is given and existing is exactly what Insert made of it, original
// comes back byte for byte under its own name: a wrapped .conf returns as the .conf
// it was. Otherwise (the primary CNI rewrote its file since) our entries are spliced
// out of existing and everything else stays.
//
// An original that itself held entries of type typ (left by an earlier install) is
// never restored: once our binary is gone, a chain naming it fails every pod.
func RemoveType(existing []byte, filename string, original *Original, typ string) (out []byte, outName string, changed bool, err error) {
	switch ext := filepath.Ext(filename); ext {
	case ".conflist":
	case ".conf", ".json":
		_, t, err := parseSingle(filename, existing)
		if err != nil {
			return nil, "", false, err
		}
		if t == typ {
			return nil, "", false, invalid(filename, "is %s's own config: delete the file instead", typ)
		}
		return existing, filename, false, nil
	default:
		return nil, "", false, invalid(filename, "extension %q is not one the runtime loads (.conf, .conflist, .json)", ext)
	}
	l, err := parseList(filename, existing)
	if err != nil {
		return nil, "", false, err
	}
	last := slices.Index(l.types, typ)
	if last < 0 {
		return existing, filename, false, nil
	}
	for i, t := range l.types {
		if t == typ {
			last = i
		}
	}
	if original != nil && isInsertOf(existing, filename, original, l.bytes(l.elems[last]), typ) {
		return slices.Clone(original.Data), original.Name, true, nil
	}
	out, es := without(l, typ)
	if len(es) == 0 {
		return nil, "", false, invalid(filename, "holds only %s entries: delete the file instead", typ)
	}
	if _, err := parseList(filename, out); err != nil {
		return nil, "", false, fmt.Errorf("taking %s out of %s would leave a config the runtime refuses: %w", typ, filepath.Base(filename), err)
	}
	return out, filename, true, nil
}

// isInsertOf reports whether existing is exactly Insert(original, entry) for an
// original free of typ.
func isInsertOf(existing []byte, filename string, original *Original, entry []byte, typ string) bool {
	if has, err := HasType(original.Data, original.Name, typ); err != nil || has {
		return false
	}
	re, name, err := Insert(original.Data, original.Name, entry)
	return err == nil && name == filepath.Base(filename) && bytes.Equal(re, existing)
}

// HasType reports whether the config (a .conflist, or a single .conf/.json named
// filename) holds a plugin of type typ.
func HasType(data []byte, filename, typ string) (bool, error) {
	if filepath.Ext(filename) == ".conflist" {
		l, err := parseList(filename, data)
		if err != nil {
			return false, err
		}
		return slices.Contains(l.types, typ), nil
	}
	_, t, err := parseSingle(filename, data)
	return t == typ, err
}

// HoldsEntry reports whether the config (a .conflist, or a single .conf/.json
// named filename) holds a plugin equal to entry as JSON, whatever its layout and
// key order: a plugin of entry's type that is not equal is another writer's.
func HoldsEntry(data []byte, filename string, entry []byte) (bool, error) {
	var want any
	if err := json.Unmarshal(entry, &want); err != nil {
		return false, invalid("istio-cni entry", "%s", err)
	}
	var plugins [][]byte
	if filepath.Ext(filename) == ".conflist" {
		l, err := parseList(filename, data)
		if err != nil {
			return false, err
		}
		for _, e := range l.elems {
			plugins = append(plugins, l.bytes(e))
		}
	} else {
		d, _, err := parseSingle(filename, data)
		if err != nil {
			return false, err
		}
		plugins = append(plugins, d.bytes(d.root))
	}
	for _, p := range plugins {
		var got any
		if json.Unmarshal(p, &got) == nil && reflect.DeepEqual(got, want) {
			return true, nil
		}
	}
	return false, nil
}

// Standalone returns the config file of istio-cni on its own, for runtimes (Multus,
// OpenShift) that call it as a separate network rather than in the primary's chain:
// entry with its "cniVersion" and "name" set (left as they are when empty), other
// keys in their order, two-space indented.
func Standalone(entry []byte, cniVersion, name string) ([]byte, error) {
	d, err := parseObject("istio-cni entry", entry)
	if err != nil {
		return nil, err
	}
	if _, err := pluginType(d.data, d.root); err != nil {
		return nil, invalid("istio-cni entry", "%s", err)
	}
	var c bytes.Buffer
	c.WriteByte('{')
	writeMember := func(key string, val []byte) {
		if c.Len() > 1 {
			c.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		c.Write(k)
		c.WriteByte(':')
		_ = json.Compact(&c, val) // val is a valid JSON value from a checked document
	}
	for _, kv := range [][2]string{{"cniVersion", cniVersion}, {"name", name}} {
		if kv[1] != "" {
			v, _ := json.Marshal(kv[1])
			writeMember(kv[0], v)
		}
	}
	for _, m := range d.members {
		if (m.key == "cniVersion" && cniVersion != "") || (m.key == "name" && name != "") {
			continue
		}
		writeMember(m.key, d.bytes(m.val))
	}
	c.WriteByte('}')
	var out bytes.Buffer
	_ = json.Indent(&out, c.Bytes(), "", "  ")
	out.WriteByte('\n')
	if _, _, err := parseSingle("istio-cni entry", out.Bytes()); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
