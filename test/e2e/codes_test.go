package e2e

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// TestADELOfARefusedConfigLetsThePrimaryReleaseTheAddress: in a chain whose config
// the plugin refuses (0.2.0, which an admin may have put it in by hand), the ADD
// fails after the primary plugin (ptp) allocated the pod's address; the runtime's
// DEL runs the chain backwards, this plugin first. Its DEL succeeds, so ptp's DEL
// runs and host-local releases the address. Before, this plugin's DEL failed with
// the same "incompatible CNI versions", the runtime's DEL stopped there, and the
// address leaked while the sandbox could not be deleted.
func TestADELOfARefusedConfigLetsThePrimaryReleaseTheAddress(t *testing.T) {
	n := newNode(t, shared)
	raw := mustJSON(t, map[string]any{"cniVersion": "0.2.0", "name": "k8s-pod-network", "plugins": []any{n.ptpEntry(), n.istioEntry(nil)}})
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	sb := n.newSandbox(createPod(t, shared, meshedPod("codes", "refused", nil)))
	_, err = n.addJSON(list, n.runtimeConf(sb))
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != types.ErrIncompatibleCNIVersion {
		t.Fatalf("ADD of a 0.2.0 chain: %v, want the plugin's incompatible-version error (1)", err)
	}
	ipam := filepath.Join(n.dir, "ipam", "k8s-pod-network")
	allocated := func() []string {
		entries, _ := os.ReadDir(ipam)
		var ips []string
		for _, e := range entries {
			if _, err := netip.ParseAddr(e.Name()); err == nil {
				ips = append(ips, e.Name())
			}
		}
		return ips
	}
	if len(allocated()) != 1 {
		t.Fatalf("after ptp's ADD host-local holds %v, want one address", allocated())
	}
	for i := range 2 {
		if err := n.del(list, sb); err != nil {
			t.Fatalf("DEL %d of the chain: %v", i+1, err)
		}
	}
	if ips := allocated(); len(ips) != 0 {
		t.Errorf("after the DEL host-local still holds %v: ptp's DEL did not run", ips)
	}
}
