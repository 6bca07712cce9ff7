package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

// How the plugin's config reaches the runtime.
const (
	// LayoutChained: an entry in the plugin list of the node's primary conflist; the
	// runtime runs it for every pod after the primary network.
	LayoutChained = "chained"
	// LayoutStandalone: a network of its own (zz-istio-cni.conf), which Multus runs for
	// pods that name it in k8s.v1.cni.cncf.io/networks (OpenShift).
	LayoutStandalone = "standalone"
	// LayoutFile: a bare entry given on the command line.
	LayoutFile = "file"
)

// PluginType is the istio-cni plugin's CNI type.
const PluginType = "istio-cni"

// ConfigSource says where the plugin's config was found and how it is wired.
type ConfigSource struct {
	Path   string `json:"path"`
	Layout string `json:"layout"`
	// Chain lists the plugin types of the conflist, in order (chained layout).
	Chain []string `json:"chain,omitempty"`
	// Warnings are problems with the node's CNI config that keep pods from getting
	// the plugin although its entry exists.
	Warnings []string `json:"warnings,omitempty"`
}

// LoadConfDir finds the istio-cni entry in the node's CNI config directory, as the
// runtime (chained) or Multus (standalone, OpenShift) would run it, and says when
// the runtime would not run it at all.
func LoadConfDir(dir string) (*plugin.Config, ConfigSource, error) {
	files, err := libcni.ConfFiles(dir, cniconf.Extensions)
	if err != nil {
		return nil, ConfigSource{}, fmt.Errorf("CNI config directory %s: %w", dir, err)
	}
	sort.Strings(files)
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		// As the agent reads it: a named pipe (or a file over cniconf.MaxConfigSize)
		// is no config and is passed over, never waited on.
		data, err := cniconf.ReadConfig(f)
		var invalid *cniconf.InvalidError
		if errors.As(err, &invalid) {
			continue
		}
		if err != nil {
			return nil, ConfigSource{}, fmt.Errorf("CNI config: %w", err)
		}
		entry, layout, chain, err := istioEntry(f, data)
		if err != nil || entry == nil {
			continue // not ours, or not loadable: the runtime skips it too
		}
		cfg, err := plugin.ParseConfig(entry)
		if err != nil {
			return nil, ConfigSource{}, fmt.Errorf("istio-cni entry in %s: %w", f, err)
		}
		src := ConfigSource{Path: f, Layout: layout, Chain: chain}
		if layout == LayoutChained {
			// The agent's own search, so that what the doctor says is what the
			// agent does.
			primary, _, perr := cniconf.FindPrimary(dir, "")
			var uneditable *cniconf.UneditableError
			if errors.As(perr, &uneditable) {
				src.Warnings = append(src.Warnings, fmt.Sprintf("the runtime's config %s: the agent leaves that file as it is and is not ready until it is fixed",
					uneditable.Error()))
			}
			if perr == nil && primary != f {
				src.Warnings = append(src.Warnings, fmt.Sprintf("the runtime uses %s (the first valid config in %s), not %s: "+
					"pods do not get istio-cni; the primary CNI wrote a new config, and the agent re-inserts the entry there when it runs",
					filepath.Base(primary), dir, filepath.Base(f)))
			}
			if chain[len(chain)-1] != PluginType {
				src.Warnings = append(src.Warnings, fmt.Sprintf("istio-cni is not last in the chain of %s (%s): plugins after it may change the pod's network", f, strings.Join(chain, ", ")))
			}
		}
		return cfg, src, nil
	}
	if len(names) == 0 {
		return nil, ConfigSource{}, fmt.Errorf("no CNI config in %s: the node's network is not configured (or this is not the runtime's config directory: pass --conf-dir)", dir)
	}
	return nil, ConfigSource{}, fmt.Errorf("no istio-cni entry in the CNI configs of %s (%s): new pods are not redirected; "+
		"the primary CNI may have rewritten its config, and the istio-cni agent puts the entry back when it runs "+
		"(kubectl logs -n %s ds/istio-cni-node); on OpenShift pass --conf-dir /etc/cni/multus/net.d",
		dir, strings.Join(names, ", "), agentNamespace())
}

// istioEntry returns the istio-cni entry of a .conflist (with the list's cniVersion
// and name, as libcni passes them to the plugin) or a .conf whose type is
// istio-cni; nil when the file holds no istio-cni.
func istioEntry(path string, data []byte) (entry []byte, layout string, chain []string, err error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, "", nil, fmt.Errorf("%s is not a JSON object: %w", path, err)
	}
	if raw, ok := top["plugins"]; ok {
		var plugins []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &plugins); err != nil {
			return nil, "", nil, fmt.Errorf("%s: plugins: %w", path, err)
		}
		var found map[string]json.RawMessage
		for _, p := range plugins {
			var typ string
			_ = json.Unmarshal(p["type"], &typ)
			chain = append(chain, typ)
			if typ == PluginType && found == nil {
				found = p
			}
		}
		if found == nil {
			return nil, "", nil, nil
		}
		for _, k := range []string{"cniVersion", "name"} {
			if v, ok := top[k]; ok {
				found[k] = v
			}
		}
		entry, err := json.Marshal(found)
		return entry, LayoutChained, chain, err
	}
	var typ string
	if err := json.Unmarshal(top["type"], &typ); err != nil || typ != PluginType {
		if _, hasType := top["type"]; !hasType {
			return nil, "", nil, errors.New(path + ": neither a conflist nor a plugin config")
		}
		return nil, "", nil, nil
	}
	return data, LayoutStandalone, nil, nil
}
