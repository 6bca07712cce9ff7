package netns_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

func TestParseIDMapAndOutside(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       netns.IDMap
		err        string
		outside    map[uint32]int64 // id -> the node's, -1: unmapped
	}{
		{name: "one range as the kernel pads it", text: "         0     100000      65536\n",
			want:    netns.IDMap{{Inside: 0, Outside: 100000, Length: 65536}},
			outside: map[uint32]int64{0: 100000, 1337: 101337, 65535: 165535, 65536: -1}},
		{name: "two ranges", text: "0 1000 1\n1 200000 65535\n",
			want:    netns.IDMap{{0, 1000, 1}, {1, 200000, 65535}},
			outside: map[uint32]int64{0: 1000, 1: 200000, 1337: 201336}},
		{name: "the whole range (the node's own)", text: "0 0 4294967295\n",
			want:    netns.IDMap{{0, 0, 4294967295}},
			outside: map[uint32]int64{4294967294: 4294967294, 4294967295: -1}},
		{name: "empty (not written yet)", text: "", outside: map[uint32]int64{0: -1}},
		{name: "two numbers", text: "0 100000\n", err: `line 1 "0 100000": want three numbers`},
		{name: "not a number", text: "0 x 1\n", err: `line 1 "0 x 1"`},
		{name: "over 32 bits", text: "0 4294967296 1\n", err: "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := netns.ParseIDMap(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseIDMap(%q) = %v, %v; want an error with %q", tc.text, m, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, m); diff != "" {
				t.Errorf("ParseIDMap(%q) (-want +got):\n%s", tc.text, diff)
			}
			for id, want := range tc.outside {
				got, ok := m.Outside(id)
				if (want < 0) != !ok || (ok && int64(got) != want) {
					t.Errorf("Outside(%d) = %d, %v; want %d", id, got, ok, want)
				}
			}
		})
	}
}

// ReadIDMaps reads the maps of a pod's user namespace through a process in it, and
// refuses a process in another user namespace (a pid reused by another process).
func TestReadIDMapsOfAPodsUserNamespace(t *testing.T) {
	root.Require(t)
	pod, owner := podWithOwner(t)
	proc := strings.TrimSuffix(pod, "/ns/net")
	uid, gid, err := netns.ReadIDMaps(proc, owner)
	if err != nil {
		t.Fatal(err)
	}
	want := netns.IDMap{{Inside: 0, Outside: testns.UserNamespaceBase, Length: 65536}}
	if diff := cmp.Diff(want, uid); diff != "" {
		t.Errorf("uid map (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, gid); diff != "" {
		t.Errorf("gid map (-want +got):\n%s", diff)
	}
	other, _ := podWithOwner(t)
	if _, _, err := netns.ReadIDMaps(strings.TrimSuffix(other, "/ns/net"), owner); err == nil || !strings.Contains(err.Error(), "not the network namespace's owner") {
		t.Errorf("ReadIDMaps through another pod's process = %v; want it refused", err)
	}
	if _, _, err := netns.ReadIDMaps("/proc/self", owner); err == nil {
		t.Error("ReadIDMaps through this process (the node's user namespace) succeeded; want it refused")
	}
}
