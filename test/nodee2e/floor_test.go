package nodee2e

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// floorPlugin is the type (and binary name) of test/harness/cmd/floor-plugin in
// the node's chain while the burst benchmark runs.
const floorPlugin = "floor-plugin"

// chainFloorPlugin builds test/harness/cmd/floor-plugin into the node's CNI bin
// dir and puts it into the node's conflist just before istio-cni, logging its
// ADDs to a file of its own; it returns that file. In the same bursts as
// istio-cni, exec'd by the same runtime for the same pods, the floor plugin's
// p99/p50 is what the machine imposes on any plugin process. Undone at cleanup.
func chainFloorPlugin(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(theNode.CNIBinDir(), floorPlugin)
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/harness/cmd/floor-plugin")
	build.Dir = theRoot
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build %s: %v\n%s", floorPlugin, err, out)
	}
	log := filepath.Join(tb.TempDir(), "floor.log")
	conf := filepath.Join(theNode.CNIConfDir(), "10-ptp.conflist")
	edit := func(change func([]map[string]any) []map[string]any) {
		tb.Helper()
		data, err := os.ReadFile(conf)
		if err != nil {
			tb.Fatal(err)
		}
		var c map[string]any
		if err := json.Unmarshal(data, &c); err != nil {
			tb.Fatalf("%s: %v", conf, err)
		}
		var plugins []map[string]any
		raw, _ := json.Marshal(c["plugins"])
		if err := json.Unmarshal(raw, &plugins); err != nil {
			tb.Fatalf("%s: plugins: %v", conf, err)
		}
		c["plugins"] = change(plugins)
		out, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			tb.Fatal(err)
		}
		tmp := conf + ".floor.tmp"
		if err := os.WriteFile(tmp, out, 0o644); err != nil {
			tb.Fatal(err)
		}
		if err := os.Rename(tmp, conf); err != nil {
			tb.Fatal(err)
		}
	}
	edit(func(plugins []map[string]any) []map[string]any {
		at := slices.IndexFunc(plugins, func(p map[string]any) bool { return p["type"] == "istio-cni" })
		if at < 0 {
			tb.Fatalf("%s: no istio-cni entry to put %s before: %v", conf, floorPlugin, conflistTypes(tb))
		}
		return slices.Insert(plugins, at, map[string]any{"type": floorPlugin, "log": log})
	})
	tb.Cleanup(func() {
		edit(func(plugins []map[string]any) []map[string]any {
			return slices.DeleteFunc(plugins, func(p map[string]any) bool { return p["type"] == floorPlugin })
		})
		os.Remove(bin)
	})
	if got := conflistTypes(tb); !slices.Equal(got, []string{"ptp", floorPlugin, "istio-cni"}) {
		tb.Fatalf("chain with %s: %v", floorPlugin, got)
	}
	return log
}

// floorADDs reads the floor plugin's ADD records of pods in namespace from its log.
func floorADDs(tb testing.TB, log, namespace string) []addRecord {
	tb.Helper()
	data, err := os.ReadFile(log)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		tb.Fatalf("floor plugin log: %v", err)
	}
	var adds []addRecord
	for _, line := range strings.Split(string(data), "\n") {
		var rec struct {
			addRecord
			Command string `json:"command"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Command != "ADD" || !strings.HasPrefix(rec.Pod, namespace+"/") {
			continue
		}
		adds = append(adds, rec.addRecord)
	}
	return adds
}
