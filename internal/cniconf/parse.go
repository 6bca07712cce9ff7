package cniconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// PluginType is the "type" of our entry in a chain: the binary the runtime runs.
const PluginType = "istio-cni"

// MaxConfigSize bounds what is read as a CNI config. Real ones are a few KiB; a file
// far larger is not a config, and reading it whole would cost the agent memory.
const MaxConfigSize = 1 << 20

// InvalidError says why a config file cannot be used or edited. The file is always
// left as it is when one is returned.
type InvalidError struct {
	File    string // base name of the file, as a person would look for it
	Problem string // what is wrong, in words
	Err     error  // the underlying error, if any
}

func (e *InvalidError) Error() string {
	if e.Err != nil {
		return e.File + ": " + e.Problem + ": " + e.Err.Error()
	}
	return e.File + ": " + e.Problem
}

func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(file, format string, args ...any) *InvalidError {
	return &InvalidError{File: filepath.Base(file), Problem: fmt.Sprintf(format, args...)}
}

// doc is a config file checked to be a JSON object, with its members located.
type doc struct {
	file    string
	data    []byte
	root    span
	members []member
}

func (d *doc) lookup(key string) []member {
	var ms []member
	for _, m := range d.members {
		if m.key == key {
			ms = append(ms, m)
		}
	}
	return ms
}

func (d *doc) bytes(s span) []byte { return d.data[s.start:s.end] }

func parseObject(file string, data []byte) (*doc, error) {
	if len(data) == 0 {
		return nil, invalid(file, "empty file")
	}
	if len(data) > MaxConfigSize {
		return nil, invalid(file, "%d bytes, more than the %d a CNI config may have", len(data), MaxConfigSize)
	}
	if err := syntaxCheck(data); err != nil {
		return nil, invalid(file, "%s", err)
	}
	start := skipSpace(data, 0)
	if data[start] != '{' {
		return nil, invalid(file, "top level is %s, not an object", kind(data[start]))
	}
	d := &doc{file: file, data: data, root: span{start, valueEnd(data, start)}}
	ms, err := objectMembers(data, d.root)
	if err != nil {
		return nil, invalid(file, "%s", err)
	}
	d.members = ms
	return d, nil
}

// list is a .conflist whose plugins are located and typed.
type list struct {
	*doc
	plugins span   // the "plugins" array
	elems   []span // each plugin object
	types   []string
}

// parseList checks a .conflist as the runtime would load it, and more strictly
// where an edit would otherwise have to guess (a duplicated "plugins" key).
func parseList(file string, data []byte) (*list, error) {
	d, err := parseObject(file, data)
	if err != nil {
		return nil, err
	}
	if err := checkName(d); err != nil {
		return nil, err
	}
	ps := d.lookup("plugins")
	switch {
	case len(ps) == 0:
		if len(d.lookup("type")) > 0 {
			return nil, invalid(file, `no "plugins" list: this is a single plugin config, name it .conf`)
		}
		return nil, invalid(file, `no "plugins" list`)
	case len(ps) > 1:
		return nil, invalid(file, `key "plugins" appears %d times`, len(ps))
	}
	p := ps[0].val
	if data[p.start] != '[' {
		return nil, invalid(file, `"plugins" is not a list (it is %s)`, kind(data[p.start]))
	}
	l := &list{doc: d, plugins: p, elems: arrayElements(data, p)}
	if len(l.elems) == 0 {
		return nil, invalid(file, `"plugins" is empty`)
	}
	for i, e := range l.elems {
		if data[e.start] != '{' {
			return nil, invalid(file, "plugins[%d] is %s, not an object", i, kind(data[e.start]))
		}
		t, err := pluginType(data, e)
		if err != nil {
			return nil, invalid(file, "plugins[%d]: %s", i, err)
		}
		l.types = append(l.types, t)
	}
	// The runtime's own parser is the final word on what loads.
	if _, err := libcni.NetworkConfFromBytes(data); err != nil {
		return nil, &InvalidError{File: filepath.Base(file), Problem: "not a CNI config list libcni accepts", Err: err}
	}
	return l, nil
}

// parseSingle checks a .conf (or .json) holding one plugin.
func parseSingle(file string, data []byte) (*doc, string, error) {
	d, err := parseObject(file, data)
	if err != nil {
		return nil, "", err
	}
	t, err := pluginType(d.data, d.root)
	if err != nil {
		if len(d.lookup("plugins")) > 0 {
			return nil, "", invalid(file, "%s: this is a plugin list, name it .conflist", err)
		}
		return nil, "", invalid(file, "%s", err)
	}
	// Unlike a list, a single config may go without a name: libcni loads it.
	if len(d.lookup("name")) > 0 {
		if err := checkName(d); err != nil {
			return nil, "", err
		}
	}
	conf, err := libcni.NetworkPluginConfFromBytes(data)
	if err == nil {
		_, err = libcni.ConfListFromConf(conf)
	}
	if err != nil {
		return nil, "", &InvalidError{File: filepath.Base(file), Problem: "not a CNI config libcni accepts", Err: err}
	}
	return d, t, nil
}

// checkName requires a string "name": libcni refuses a list without one, and a
// wrapped .conf gives its list its name.
func checkName(d *doc) error {
	ns := d.lookup("name")
	if len(ns) == 0 {
		return invalid(d.file, `no "name"`)
	}
	n := ns[len(ns)-1].val
	if d.data[n.start] != '"' {
		return invalid(d.file, `"name" is not a string (it is %s)`, kind(d.data[n.start]))
	}
	return nil
}

// pluginType reads a plugin's "type" exactly as libcni does, which decodes it into
// a struct field: the key matches case-insensitively, the last match wins and a
// null leaves it unset.
func pluginType(b []byte, obj span) (string, error) {
	ms, err := objectMembers(b, obj)
	if err != nil {
		return "", err
	}
	var raw []byte
	for _, m := range ms {
		if strings.EqualFold(m.key, "type") && b[m.val.start] != 'n' {
			raw = b[m.val.start:m.val.end]
		}
	}
	if raw == nil {
		return "", fmt.Errorf(`no "type"`)
	}
	if raw[0] != '"' {
		return "", fmt.Errorf(`"type" is not a string (it is %s)`, kind(raw[0]))
	}
	s, err := decodeString(raw)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf(`"type" is empty`)
	}
	return s, nil
}

// parseEntry checks our plugin entry (the CNI_NETWORK_CONFIG template after
// substitution) and returns it compacted, with its type.
func parseEntry(entry []byte) ([]byte, string, error) {
	d, err := parseObject("istio-cni entry", entry)
	if err != nil {
		return nil, "", err
	}
	t, err := pluginType(d.data, d.root)
	if err != nil {
		return nil, "", invalid("istio-cni entry", "%s", err)
	}
	var c bytes.Buffer
	if err := json.Compact(&c, d.bytes(d.root)); err != nil {
		return nil, "", invalid("istio-cni entry", "%s", err)
	}
	return c.Bytes(), t, nil
}
