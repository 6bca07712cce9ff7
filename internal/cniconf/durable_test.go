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
