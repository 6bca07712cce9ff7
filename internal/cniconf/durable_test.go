package cniconf

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
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

// TestUninstallKeepsAConfItsCNIWroteAgain: the primary's daemon writes its .conf
// again while the agent's wrap of the earlier version is in place (flannel's init
// container copies it at every restart of its pod; the agent, stopping, no longer
// watches). The uninstall must keep that newer .conf, which the runtime loads
// first anyway, and only take out the wrap: before, it put the backup of the old
// version over it, and the daemon's new config was lost until its next restart.
func TestUninstallKeepsAConfItsCNIWroteAgain(t *testing.T) {
	const (
		old   = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"mtu":1450}}`
		newer = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"mtu":8951}}`
	)
	for _, typ := range []string{PluginType, "v2-3-" + PluginType} { // CNI_BINARIES_PREFIX
		t.Run(typ, func(t *testing.T) {
			dir := writeDir(t, map[string]string{"10-flannel.conf": old})
			entry := bytes.Replace(testEntry(t), []byte(`"type": "istio-cni"`), []byte(`"type": "`+typ+`"`), 1)
			written, err := Install(dir, "10-flannel.conf", entry)
			if err != nil || filepath.Base(written) != "10-flannel.conflist" {
				t.Fatalf("Install: %s, %v; want the wrap 10-flannel.conflist", written, err)
			}
			conf := filepath.Join(dir, "10-flannel.conf")
			if err := os.WriteFile(conf, []byte(newer), 0o600); err != nil {
				t.Fatal(err)
			}
			restored, err := UninstallType(dir, "10-flannel.conflist", typ)
			if err != nil || restored != conf {
				t.Errorf("Uninstall: %s, %v; want 10-flannel.conf", restored, err)
			}
			if diff := cmp.Diff(map[string]string{"10-flannel.conf": "-rw-------\n" + newer}, snapshot(t, dir)); diff != "" {
				t.Errorf("conf dir after the uninstall (-want +got):\n%s", diff)
			}
		})
	}
}
