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
// NAME.conf (an earlier install wrapped it) and NAME.conf for a NAME.conflist.
//
// Files passed over come back in skipped with the reason, for the agent to log.
// Our own config (only istio-cni plugins) is never a primary. The error wraps
// ErrNoPrimary when there is no primary yet; for a named file that exists but is
// invalid, it is an *InvalidError. A file that could not be read (see unread), or
// is a link to a path this container does not see, is not passed over: the search
// stops with its error.
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
// may be the primary the runtime uses, so it is not passed over.
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
		// the other way round (a primary CNI that changed its format).
		other := ""
		switch filepath.Ext(name) {
		case ".conf":
			other = path + "list"
		case ".conflist":
			other = strings.TrimSuffix(path, "list")
		}
		if _, err := os.Stat(other); other != "" && err == nil {
			path = other
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
		l, err := parseList(path, data)
		if err != nil {
			return err
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
		return err
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
		switch err := checkPrimary(f); {
		case err == nil:
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
