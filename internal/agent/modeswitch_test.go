package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/cniconf"
)

// TestAnAgentOfTheOtherModeTakesOutWhatTheEarlierAgentInstalled: a helm upgrade
// that switches chained (the entry in the primary's chain) and standalone (its own
// file, for Multus) replaces an agent that exits keeping its install in place (a
// restart: UNINSTALL_ON_EXIT=auto keeps it). The new agent must take out what the
// other mode put there: a chained entry left beside the standalone file runs the
// plugin for every pod of the node, Multus network or not, and once the new agent
// uninstalls (removing the binary) the primary's chain names a plugin that is
// gone, which fails every pod's network on the node; a standalone file left beside
// the chained entry stays behind after the uninstall as a config of a binary that
// is gone.
func TestAnAgentOfTheOtherModeTakesOutWhatTheEarlierAgentInstalled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		primary       string // file name
		content       string
		earlier, next []string
		// gone is what the earlier agent installed and the next must have taken out.
		gone func(t *testing.T, n *node) string
	}{
		{"chained into a conflist, then standalone", "10-calico.conflist", calicoConflist,
			nil, []string{"CHAINED_CNI_PLUGIN=false"},
			func(t *testing.T, n *node) string {
				if got := pluginTypes(t, filepath.Join(n.confDir, "10-calico.conflist")); countType(got, cniconf.PluginType) != 0 {
					return fmt.Sprintf("the primary's chain still holds the earlier agent's entry: %v", got)
				}
				return ""
			}},
		{"chained into a wrapped conf, then standalone", "10-flannel.conf", flannelConf,
			nil, []string{"CHAINED_CNI_PLUGIN=false"},
			func(t *testing.T, n *node) string {
				if got := snapshot(t, n.confDir); got["10-flannel.conflist"] != (fileState{}) || got["10-flannel.conf"].Data != flannelConf {
					return fmt.Sprintf("the primary is still wrapped with the earlier agent's entry: %v", keys(got))
				}
				return ""
			}},
		{"standalone, then chained", "10-calico.conflist", calicoConflist,
			[]string{"CHAINED_CNI_PLUGIN=false"}, nil,
			func(t *testing.T, n *node) string {
				if _, ok := snapshot(t, n.confDir)[DefaultStandaloneName]; ok {
					return "the earlier agent's standalone " + DefaultStandaloneName + " is still there"
				}
				return ""
			}},
		{"standalone, then standalone under another CNI_CONF_NAME", "10-calico.conflist", calicoConflist,
			[]string{"CHAINED_CNI_PLUGIN=false"}, []string{"CHAINED_CNI_PLUGIN=false", "CNI_CONF_NAME=zzz-istio-cni.conf"},
			func(t *testing.T, n *node) string {
				got := snapshot(t, n.confDir)
				if _, ok := got[DefaultStandaloneName]; ok {
					return "the earlier agent's standalone " + DefaultStandaloneName + " is still there beside the next one's: " + strings.Join(keys(got), ", ")
				}
				if _, ok := got["zzz-istio-cni.conf"]; !ok {
					return "the next agent's zzz-istio-cni.conf is not there: " + strings.Join(keys(got), ", ")
				}
				return ""
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			writeFile(t, filepath.Join(n.confDir, tc.primary), []byte(tc.content), 0o644)
			before := snapshot(t, n.confDir)

			earlier := n.startAgent(t, append([]string{"UNINSTALL_ON_EXIT=never"}, tc.earlier...)...)
			earlier.waitReady(t)
			earlier.stop(t)

			next := n.startAgent(t, tc.next...)
			next.waitReady(t)
			// Ready: its first reconcile is done.
			if left := tc.gone(t, n); left != "" {
				t.Errorf("the next agent is ready, and %s", left)
			}
			next.stop(t)
			if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
				t.Errorf("conf dir after the next agent's uninstall differs from before the install (-before +after):\n%s", diff)
			}
		})
	}
}
