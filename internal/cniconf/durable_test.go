package cniconf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestAWrapIsDurableBeforeItEnds: a wrapped .conf is replaced by NAME.conflist,
// and its removal must reach the disk as the rename does (a sync of the directory
// after it). Otherwise a power loss within the file system's commit interval
// brings the .conf back beside the .conflist after the reboot: it sorts first, the
// runtime loads it without the istio-cni entry, and the pods the kubelet restarts
// before the agent runs start without redirection.
func TestAWrapIsDurableBeforeItEnds(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-flannel.conf")
	if err := os.WriteFile(conf, []byte(`{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	var syncs, afterRemoval int
	syncDir = func(d string) {
		if d == dir || d == dir+string(filepath.Separator) {
			syncs++
			if _, err := os.Lstat(conf); errors.Is(err, fs.ErrNotExist) {
				afterRemoval++
			}
		}
		orig(d)
	}
	if _, err := Install(dir, "10-flannel.conf", testEntry(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "10-flannel.conflist")); err != nil {
		t.Fatalf("the wrap made no 10-flannel.conflist: %v", err)
	}
	if afterRemoval == 0 {
		t.Errorf("10-flannel.conf was removed and its directory never synced after (%d syncs before): a power loss may bring it back beside 10-flannel.conflist, and the runtime loads it first, without the istio-cni entry", syncs)
	}
}

// TestAWrapKeepsAConfItsCNIRewroteMeanwhile: the primary's daemon writes its .conf
// again (its restart, a new setting) while the agent wraps the earlier version:
// after the wrap's .conflist is in place, before the .conf is removed. Removing it
// then lost the daemon's new version for good: the .conflist held the old one, and
// nothing would write the .conf again. The new version must stay (sorting first, the
// runtime loads it as it would without us) and the next Install wraps it.
func TestAWrapKeepsAConfItsCNIRewroteMeanwhile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-flannel.conf")
	const (
		old   = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"mtu":1450}}`
		newer = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"mtu":8951}}`
	)
	if err := os.WriteFile(conf, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	rewrote := false
	syncDir = func(d string) {
		orig(d)
		// The first sync after the .conflist's rename: the .conf is still there.
		if _, err := os.Stat(filepath.Join(dir, "10-flannel.conflist")); err == nil && !rewrote {
			rewrote = true
			if err := os.WriteFile(conf, []byte(newer), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	_, err := Install(dir, "10-flannel.conf", testEntry(t))
	if !rewrote {
		t.Fatal("the test never rewrote the .conf during the wrap")
	}
	syncDir = orig
	if data, rerr := os.ReadFile(conf); rerr != nil || string(data) != newer {
		t.Fatalf("after a wrap during which the daemon rewrote 10-flannel.conf (Install: %v), 10-flannel.conf holds %q (%v); want the daemon's new version kept", err, data, rerr)
	}
	if !errors.Is(err, ErrChanged) {
		t.Errorf("Install: %v, want ErrChanged so that the caller edits the new version", err)
	}
	// The agent's retry wraps the new version.
	if _, err := Install(dir, "10-flannel.conf", testEntry(t)); err != nil {
		t.Fatal(err)
	}
	want, _, err := Insert([]byte(newer), "10-flannel.conf", testEntry(t))
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "10-flannel.conflist")); err != nil || string(data) != string(want) {
		t.Errorf("after the retry 10-flannel.conflist holds (%v):\n%s\nwant the wrap of the daemon's new version:\n%s", err, data, want)
	}
	if _, err := os.Stat(conf); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the retry 10-flannel.conf is still there (%v)", err)
	}
}
