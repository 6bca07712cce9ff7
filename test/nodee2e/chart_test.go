package nodee2e

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// The whole life of a chained install: helm install puts the plugin last in the
// primary network's chain; meshed pods get the capture and their traffic goes
// through the proxy; excluded pods are left alone; helm upgrade rewrites the entry;
// a primary CNI rewriting its file gets the entry back; helm uninstall leaves the
// CNI dirs exactly as they were.
func TestHelmInstallMeshTrafficUpgradeAndUninstallOnARealNode(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	confBefore := confDir(t)
	binsBefore, err := meshnode.BinDir(theNode)
	if err != nil {
		t.Fatal(err)
	}
	install(t, s, values(t))

	t.Run("the agent puts istio-cni last in the primary chain and installs the binary", func(t *testing.T) {
		if got := conflistTypes(t); !slices.Equal(got, []string{"ptp", "istio-cni"}) {
			t.Errorf("chain %v, want [ptp istio-cni]", got)
		}
		bins, _ := meshnode.BinDir(theNode)
		if !slices.Contains(bins, "istio-cni") {
			t.Errorf("bin dir %v has no istio-cni", bins)
		}
	})

	pods := createPods(t,
		meshnode.MeshedPod("mesh", "app"),
		meshnode.MeshedPod("mesh", "client"),
		meshnode.MeshedPod("istio-system", "outsider"))
	app, client, outsider := pods[0], pods[1], pods[2]

	t.Run("a meshed pod is captured and its traffic goes through the proxy both ways", func(t *testing.T) {
		checkCapturedTraffic(t, s, client, app)
	})
	t.Run("a pod in an excluded namespace has no rules and bypasses its proxy", func(t *testing.T) {
		checkUntouched(t, s, outsider, app)
	})

	t.Run("helm upgrade with changed values rewrites the entry and running pods keep working", func(t *testing.T) {
		if err := s.Upgrade(ctx, values(t, "--set", "logLevel=debug", "--set", "excludeNamespaces={istio-system,late}")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the entry has plugin_log_level debug and excludes late", 60*time.Second, func() bool {
			e := istioEntry(t)
			return e != nil && e["plugin_log_level"] == "debug" && strings.Contains(strings.Join(toStrings(e["exclude_namespaces"]), ","), "late")
		})
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if _, err := meshnode.WaitAgentReady(wctx, theNode, meshnode.Namespace); err != nil {
			t.Fatal(err)
		}
		checkCapturedTraffic(t, s, client, app)
		late := createPods(t, meshnode.MeshedPod("late", "late"))[0]
		checkUntouched(t, s, late, app)
	})

	t.Run("the primary CNI rewriting its config gets the istio-cni entry back", func(t *testing.T) {
		conf := filepath.Join(theNode.CNIConfDir(), "10-ptp.conflist")
		tmp := conf + ".tmp"
		if err := os.WriteFile(tmp, []byte(confBefore["10-ptp.conflist"]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, conf); err != nil { // as a primary CNI writes it: by rename
			t.Fatal(err)
		}
		waitFor(t, "istio-cni back in the chain", 30*time.Second, func() bool {
			return slices.Equal(conflistTypes(t), []string{"ptp", "istio-cni"})
		})
		again := createPods(t, meshnode.MeshedPod("mesh", "after-rewrite"))[0]
		checkCapturedTraffic(t, s, again, app)
	})

	t.Run("helm uninstall leaves the CNI conf and bin dirs as before", func(t *testing.T) {
		// Pods go first, while the plugin can still run their DEL.
		for _, p := range []string{"app", "client"} {
			meshnode.Run(ctx, theNode, theTools.Kubectl, "delete", "pod", "-n", "mesh", p, "--wait=true")
		}
		if err := s.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
		after := confDir(t)
		if err := meshnode.SameDir(confBefore, after); err != nil {
			t.Errorf("conf dir after uninstall: %v", err)
		}
		bins, _ := meshnode.BinDir(theNode)
		if want := meshnode.AfterUninstall(binsBefore); !slices.Equal(bins, want) {
			t.Errorf("bin dir after uninstall %v, want %v (the plugin's binary stays)", bins, want)
		}
	})
}

// Standalone mode (OpenShift/Multus): the agent writes its own zz-istio-cni.conf
// (its default name, which sorts after the primary's file, so the runtime keeps the
// primary as the pods' network) and leaves the primary's chain alone; uninstall
// removes it.
func TestStandaloneModeWritesItsOwnConfAndLeavesThePrimaryAlone(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	before := confDir(t)
	install(t, s, values(t, "--set", "chained=false"))
	after := confDir(t)
	if after["10-ptp.conflist"] != before["10-ptp.conflist"] {
		t.Errorf("the primary's conflist changed in standalone mode:\n%s", after["10-ptp.conflist"])
	}
	conf, ok := after["zz-istio-cni.conf"]
	if !ok {
		t.Fatalf("no zz-istio-cni.conf in the conf dir: %v", keys(after))
	}
	if !strings.Contains(conf, `"type": "istio-cni"`) && !strings.Contains(conf, `"type":"istio-cni"`) {
		t.Errorf("zz-istio-cni.conf is not the plugin's config:\n%s", conf)
	}
	if names := slices.Sorted(maps.Keys(after)); names[len(names)-1] != "zz-istio-cni.conf" {
		t.Errorf("the standalone config does not sort last: %v", names)
	}
	if err := s.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	final, _ := meshnode.ConfDir(theNode)
	if err := meshnode.SameDir(before, final); err != nil {
		t.Errorf("conf dir after uninstall: %v", err)
	}
}

// confDir is meshnode.ConfDir of the test's node.
func confDir(t testing.TB) map[string]string {
	t.Helper()
	c, err := meshnode.ConfDir(theNode)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func toStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
