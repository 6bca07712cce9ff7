package chart

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/plugin"
)

// TestExtraBypassUIDsReachThePluginConfig: the admin's node-wide bypass uids land in
// the plugin's entry, which the plugin's own parser accepts; by default the key is
// absent.
func TestExtraBypassUIDsReachThePluginConfig(t *testing.T) {
	if _, ok := networkConfig(t, mustRender(t))["extra_bypass_uids"]; ok {
		t.Error("extra_bypass_uids rendered although none were set")
	}
	m := mustRender(t, "--set", "extraBypassUIDs={1000650000,1000}")
	conf := networkConfig(t, m)
	raw, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := plugin.ParseConfig(raw)
	if err != nil {
		t.Fatalf("the plugin refuses the rendered entry: %v", err)
	}
	if diff := cmp.Diff([]uint32{1000650000, 1000}, cfg.ExtraBypassUIDs); diff != "" {
		t.Errorf("extra_bypass_uids (-want +got):\n%s", diff)
	}
	if _, err := render(t, "--set", "extraBypassUIDs={-1}"); err == nil {
		t.Error("a negative uid was accepted")
	}
}
