package cniconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/libcni"
)

// ErrNoPrimary means the directory holds no config the runtime would use as the
// node's network yet; the agent waits for the primary CNI to write one.
var ErrNoPrimary = errors.New("no primary CNI config")

// Extensions are the config file extensions the runtimes load (libcni ConfFiles as
// called by containerd, CRI-O and the kubelet's old dockershim).
var Extensions = []string{".conf", ".conflist", ".json"}

// Skipped is a config file passed over while looking for the primary, and why.
type Skipped struct {
	Name string
	Err  error
}

func (s Skipped) String() string { return s.Err.Error() }

// FindPrimary returns the path of the config the runtime uses for pods: with name
// empty, the first file of dir in lexical order with a loadable extension that
// holds a valid config, as libcni's ConfFiles plus a sort pick it; with name given
// (CNI_CONF_NAME), exactly that file, or, when it is not there, NAME.conflist for a
// NAME.conf or NAME.json (an earlier install wrapped it) and NAME.conf, then
// NAME.json, for a NAME.conflist.
//
// Files passed over come back in skipped with the reason, for the agent to log.
// Our own config (only istio-cni plugins) is never a primary. The error wraps
// ErrNoPrimary when there is no primary yet; for a named file that exists but is
// invalid, it is an *InvalidError. A file that could not be read (see unread), is a
// link to a path this container does not see, or is one the runtime loads but the
// agent does not edit (*UneditableError), is not passed over: the search stops with
// its error.
func FindPrimary(dir, name string) (path string, skipped []Skipped, err error) {
	if name != "" {
		return findNamed(dir, name)
	}
	files, err := libcni.ConfFiles(dir, Extensions)
	if err != nil {
		return "", nil, fmt.Errorf("list CNI configs: %w", err)
	}
	sort.Strings(files)
	for _, f := range files {
		if err := checkPrimary(f); err != nil {
			if unread(err) {
				return "", skipped, err
			}
			skipped = append(skipped, Skipped{Name: filepath.Base(f), Err: err})
			continue
		}
		return f, skipped, nil
	}
	return "", skipped, fmt.Errorf("%w in %s (%d files skipped)", ErrNoPrimary, dir, len(skipped))
}

// unread reports whether err, of checkPrimary, says the file could not be read
// (out of descriptors: EMFILE, ENFILE; EAGAIN, EIO, ...) rather than that it is no
// config (*InvalidError) or is gone: nothing is known of its content then, and it
// may be the primary the runtime uses, so it is not passed over. An
// *UneditableError is not passed over either: the runtime loads that file.
func unread(err error) bool {
	var invalid *InvalidError
	return !errors.As(err, &invalid) && !errors.Is(err, fs.ErrNotExist)
}

func findNamed(dir, name string) (string, []Skipped, error) {
	if filepath.Base(name) != name || !slices.Contains(Extensions, filepath.Ext(name)) {
		return "", nil, fmt.Errorf("CNI_CONF_NAME %q: not a file name ending in .conf, .conflist or .json", name)
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		// As Istio's install-cni: a .conf may have become a .conflist (our wrap) and
		// the other way round (a primary CNI that changed its format); so may a
		// .json, which we wrap alike.
		base := strings.TrimSuffix(path, filepath.Ext(name))
		others := []string{base + ".conflist"}
		if filepath.Ext(name) == ".conflist" {
			others = []string{base + ".conf", base + ".json"}
		}
		for _, other := range others {
			if _, err := os.Stat(other); err == nil {
				path = other
				break
			}
		}
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("%w: %s does not exist", ErrNoPrimary, path)
	}
	if err := checkPrimary(path); err != nil {
		return "", nil, err
	}
	return path, nil, nil
}

// checkPrimary reads a config and says why it cannot be the primary, if it cannot.
func checkPrimary(path string) error {
	data, err := ReadConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		if target, lerr := os.Readlink(path); lerr == nil {
			// A link to a path this container does not mount (an absolute one, or a
			// directory outside the conf dir): the runtime, on the host, may follow
			// it. Nothing is known of its content, as of a file that could not be
			// read (unread): not passed over.
			return fmt.Errorf("%s is a symbolic link to %s, which this container does not see: mount that path into the agent, or remove the link", path, target)
		}
	}
	if err != nil {
		return err
	}
	if filepath.Ext(path) == ".conflist" {
		if err := chainInDir(path, data); err != nil {
			return err
		}
		l, err := parseList(path, data)
		if err != nil {
			return loadedAnyway(path, data, err)
		}
		for _, t := range l.types {
			if t != PluginType {
				return nil
			}
		}
		return invalid(path, "holds only %s plugins: our own config, not a primary network", PluginType)
	}
	_, t, err := parseSingle(path, data)
	if err != nil {
		return loadedAnyway(path, data, err)
	}
	if t == PluginType {
		return invalid(path, "is %s's own config, not a primary network", PluginType)
	}
	return nil
}

// ConfigsAfter lists the network configs of dir that a runtime would load after a
// file named name: the files with a loadable extension whose names sort after it in
// byte order and that hold a valid config other than ours. A runtime loads the first
// config in that order as the node's network, so a standalone istio-cni config must
// have none after it.
func ConfigsAfter(dir, name string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, Extensions)
	if err != nil {
		return nil, fmt.Errorf("list CNI configs: %w", err)
	}
	sort.Strings(files)
	var after []string
	for _, f := range files {
		base := filepath.Base(f)
		if base <= name {
			continue
		}
		var uneditable *UneditableError
		switch err := checkPrimary(f); {
		case err == nil, errors.As(err, &uneditable):
			after = append(after, base)
		case unread(err):
			return nil, err
		}
	}
	return after, nil
}

// NamedBefore lists the configs of dir whose names sort before name in byte order
// and whose network "name" is network: Multus resolves a NetworkAttachmentDefinition
// without a config of its own to the first file of its config dir with that
// network name, so a standalone istio-cni config needs none before it.
func NamedBefore(dir, name, network string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, Extensions)
	if err != nil {
		return nil, fmt.Errorf("list CNI configs: %w", err)
	}
	sort.Strings(files)
	var before []string
	for _, f := range files {
		base := filepath.Base(f)
		if base >= name {
			break
		}
		data, err := ReadConfig(f)
		if err != nil && unread(err) {
			return nil, err // Multus may read what this process cannot now
		}
		if err != nil {
			continue // Multus cannot take it either
		}
		var c struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(data, &c) == nil && c.Name == network {
			before = append(before, base)
		}
	}
	return before, nil
}

// UneditableError says the runtime loads a config that the agent does not edit: its
// chain goes on in the list's plugin directory (chainInDir), or the agent's stricter
// reading refuses it (a key given twice). The file is left as it is; it is the
// runtime's network all the same, so the search for the primary stops at it rather
// than pass it over for a later file, which the runtime does not use.
type UneditableError struct {
	File    string // base name of the config
	Problem string // why it is not edited, and what to change
}

func (e *UneditableError) Error() string { return e.File + ": " + e.Problem }

// chainInDir returns an *UneditableError when the runtime's chain for the .conflist
// at path, holding data, goes on in its plugin directory: libcni (1.3 on, which
// recent containerd 2 releases load configs with: 2.4's go-cni has 1.3.1) appends
// to the plugins a list holds those of the .conf files in DIR/NAME, NAME its
// network name, unless it sets "loadOnlyInlinedPlugins"; a list may then hold no
// "plugins" at all. An entry put last in the file would run before those plugins,
// and a list without "plugins" has no place for it. The directory is listed as
// libcni lists it (every entry, no bound but the directory's own). A list libcni
// does not parse is left to parseList to name; a plugin directory it cannot list (a
// file of that name) makes the runtime refuse the list, an *InvalidError.
func chainInDir(path string, data []byte) error {
	if filepath.Ext(path) != ".conflist" {
		return nil // a .conf or .json is read alone
	}
	l, err := libcni.NetworkConfFromBytes(data)
	if err != nil || l.LoadOnlyInlinedPlugins {
		return nil
	}
	dir := filepath.Join(filepath.Dir(path), l.Name)
	files, err := libcni.ConfFiles(dir, []string{".conf"})
	switch {
	case errors.Is(err, syscall.ENOTDIR):
		return &InvalidError{File: filepath.Base(path), Problem: fmt.Sprintf("its plugin directory %s is not a directory, and the runtime refuses the list", dir), Err: err}
	case err != nil:
		return fmt.Errorf("list the plugin directory %s of %s: %w", dir, filepath.Base(path), err)
	case len(files) == 0:
		return nil
	}
	configs := fmt.Sprintf("%d configs", len(files))
	if len(files) == 1 {
		configs = "1 config"
	}
	inline := "none"
	if len(l.Plugins) > 0 {
		var types []string
		for _, p := range l.Plugins {
			types = append(types, p.Network.Type)
		}
		inline = strings.Join(types, ", ")
	}
	// ConfFiles keeps os.ReadDir's order, by name: the runtime's.
	return &UneditableError{File: filepath.Base(path), Problem: fmt.Sprintf(`the runtime runs the plugins of the %s in its plugin directory %s (%s first) after those the file lists (%s), `+
		`so an istio-cni entry in the file would not be last in the chain; move them into its "plugins" list, `+
		`or set "loadOnlyInlinedPlugins": true if they are not this network's`, configs, dir, filepath.Base(files[0]), inline)}
}

// runtimeLoads reports whether libcni, as the runtime calls it, loads data read
// from path as a network (its plugin directory aside: see chainInDir).
func runtimeLoads(path string, data []byte) bool {
	if filepath.Ext(path) == ".conflist" {
		l, err := libcni.NetworkConfFromBytes(data)
		return err == nil && len(l.Plugins) > 0
	}
	conf, err := libcni.NetworkPluginConfFromBytes(data)
	if err == nil {
		_, err = libcni.ConfListFromConf(conf)
	}
	return err == nil
}

// loadedAnyway turns err, an *InvalidError of the agent's reading of data, into an
// *UneditableError when the runtime loads data all the same.
func loadedAnyway(path string, data []byte, err error) error {
	var invalid *InvalidError
	if !errors.As(err, &invalid) || !runtimeLoads(path, data) {
		return err
	}
	return &UneditableError{File: invalid.File, Problem: invalid.Problem +
		", which libcni, as the runtime reads configs, accepts: this agent neither edits it nor passes it over for a later file; fix it"}
}
