package cniconf

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// version makes the i-th content of the file: a header naming it, then filler, in
// sizes from a few bytes to 64 KiB so that a torn read could not look whole.
func version(i int) []byte {
	size := 16 + (i*7919)%(64<<10)
	head := fmt.Sprintf("v%04d %06d\n", i, size)
	b := bytes.Repeat([]byte{byte('a' + i%26)}, size)
	copy(b, head)
	return b
}

// TestWriteAtomicNeverExposesAPartialFile rewrites one file 500 times with
// different sizes while another goroutine reads it in a loop: every read must be
// exactly one of the written versions, whole.
func TestWriteAtomicNeverExposesAPartialFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10-calico.conflist")
	const n = 500
	versions := make([][]byte, n)
	for i := range versions {
		versions[i] = version(i)
	}
	if err := WriteAtomic(path, versions[0], 0o640); err != nil {
		t.Fatal(err)
	}

	var done atomic.Bool
	var reads, distinct atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := -1
		for !done.Load() {
			got, err := os.ReadFile(path)
			if err != nil {
				errs <- fmt.Errorf("read %d: %w", reads.Load(), err)
				return
			}
			reads.Add(1)
			k := -1
			if len(got) >= 5 {
				k, _ = strconv.Atoi(string(got[1:5]))
			}
			if k < 0 || k >= n || !bytes.Equal(got, versions[k]) {
				errs <- fmt.Errorf("read %d: %d bytes starting %q are no complete version", reads.Load(), len(got), got[:min(12, len(got))])
				return
			}
			if k != last {
				distinct.Add(1)
				last = k
			}
		}
	}()
	// Write every version once, then keep cycling through them until the reader has
	// raced the writer enough (bounded): a starved reader on a loaded machine makes
	// the run longer, not red.
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; i < n || ((reads.Load() < 100 || distinct.Load() < 10) && time.Now().Before(deadline)); i++ {
		if err := WriteAtomic(path, versions[i%n], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Let the reader see the last version at least once.
	time.Sleep(5 * time.Millisecond)
	done.Store(true)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("%d reads saw %d version changes", reads.Load(), distinct.Load())
	if reads.Load() < 100 || distinct.Load() < 10 {
		t.Errorf("only %d reads and %d version changes: the reader did not race the writer", reads.Load(), distinct.Load())
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want the file's own 0640 kept over every rewrite", fi.Mode().Perm())
	}
	if diff := cmp.Diff([]string{"10-calico.conflist"}, listDir(t, dir)); diff != "" {
		t.Errorf("temporary files left (-want +got):\n%s", diff)
	}
}

func TestWriteAtomicModes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.conflist")
	if err := WriteAtomic(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("new file mode %v, want 0644 as asked", fi.Mode().Perm())
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(path, []byte("{ }"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("rewritten file mode %v, want its own 0600 kept", fi.Mode().Perm())
	}
	err := WriteAtomic(filepath.Join(dir, "absent", "x.conf"), []byte("{}"), 0o644)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write into a missing dir: %v", err)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// snapshot is a directory's files with contents and modes.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, name := range listDir(t, dir) {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = fi.Mode().String() + "\n" + string(readFile(t, p))
	}
	return m
}

// TestInstallUninstallLeavesDirAsBefore installs into a conf dir holding each
// real-world config (beside an unrelated one), then uninstalls: the directory is
// exactly as before, names, bytes and modes, a wrapped .conf included.
func TestInstallUninstallLeavesDirAsBefore(t *testing.T) {
	entry := testEntry(t)
	for _, in := range inputs(t) {
		name := "10-" + filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, name), readFile(t, in), 0o640); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "99-loopback.conf"), []byte(`{"cniVersion":"0.3.1","name":"lo","type":"loopback"}`), 0o644); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, dir)

			written, err := Install(dir, name, entry)
			if err != nil {
				t.Fatal(err)
			}
			out, outName, err := Insert(readFile(t, in), name, entry)
			if err != nil {
				t.Fatal(err)
			}
			if written != filepath.Join(dir, outName) || !bytes.Equal(readFile(t, written), out) {
				t.Errorf("Install wrote %s, want Insert's output in %s", written, outName)
			}
			if fi, _ := os.Stat(written); fi.Mode().Perm() != 0o640 {
				t.Errorf("written mode %v, want the primary's 0640", fi.Mode().Perm())
			}
			if p, _, err := FindPrimary(dir, ""); err != nil || p != written {
				t.Errorf("after install the runtime would use %s (%v), want %s", p, err, written)
			}
			// A second install (agent restart) changes nothing, not even the inode.
			st1, _ := os.Stat(written)
			if again, err := Install(dir, outName, entry); err != nil || again != written {
				t.Fatalf("second Install: %s, %v", again, err)
			}
			if st2, _ := os.Stat(written); !os.SameFile(st1, st2) {
				t.Errorf("second Install rewrote an unchanged file")
			}

			restored, err := Uninstall(dir, outName)
			if err != nil {
				t.Fatal(err)
			}
			if restored != filepath.Join(dir, name) {
				t.Errorf("Uninstall restored %s, want %s", restored, name)
			}
			after := snapshot(t, dir)
			if name == "10-legacy-istio.conflist" {
				// The stale istio-cni entry an older install left goes too.
				want, _, _, err := Remove(readFile(t, in), name, nil)
				if err != nil {
					t.Fatal(err)
				}
				before[name] = "-rw-r-----\n" + string(want)
			}
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("conf dir after install+uninstall (-before +after):\n%s", diff)
			}
		})
	}
}

// TestInstallAfterPrimaryRewrite: the primary CNI rewrites its file without our
// entry; Install puts it back and keeps the new version as the original, so
// Uninstall leaves the primary's latest config.
func TestInstallAfterPrimaryRewrite(t *testing.T) {
	dir := t.TempDir()
	entry := testEntry(t)
	path := filepath.Join(dir, "10-calico.conflist")
	v1 := readFile(t, "testdata/in/calico.conflist")
	v2 := bytes.Replace(v1, []byte(`"mtu": 0`), []byte(`"mtu": 1440`), 1)
	if err := os.WriteFile(path, v1, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir, "10-calico.conflist", entry); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(path, v2, 0o644); err != nil { // what calico-node does on restart
		t.Fatal(err)
	}
	if _, err := Install(dir, "10-calico.conflist", entry); err != nil {
		t.Fatal(err)
	}
	if types := pluginTypes(t, path, readFile(t, path)); types[len(types)-1] != PluginType {
		t.Fatalf("not re-inserted: %v", types)
	}
	if _, err := Uninstall(dir, "10-calico.conflist"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"10-calico.conflist": "-rw-r--r--\n" + string(v2)}, snapshot(t, dir)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestInstallLeavesBrokenConfigUntouched: a truncated, garbage or unreadable primary
// is left byte for byte, nothing else appears in the dir, and the error names it.
func TestInstallLeavesBrokenConfigUntouched(t *testing.T) {
	calico := readFile(t, "testdata/in/calico.conflist")
	tests := []struct {
		name, content, wantErr string
	}{
		{"truncated", string(calico[:200]), "10-calico.conflist: invalid JSON at offset 200: unexpected end of JSON input"},
		{"garbage", "\x00\x01binary", "10-calico.conflist: invalid JSON at offset 1: invalid character '\\x00' looking for beginning of value"},
		{"plugins not a list", `{"name":"k8s","plugins":"calico"}`, `10-calico.conflist: "plugins" is not a list (it is a string)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "10-calico.conflist"), []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, dir)
			_, err := Install(dir, "10-calico.conflist", testEntry(t))
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("Install: %v, want %s", err, tt.wantErr)
			}
			_, err = Uninstall(dir, "10-calico.conflist")
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("Uninstall: %v, want %s", err, tt.wantErr)
			}
			if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
				t.Errorf("dir changed (-before +after):\n%s", diff)
			}
		})
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "10-calico.conflist"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir, "10-calico.conflist", testEntry(t)); err == nil {
		t.Errorf("Install into a directory named like a config succeeded")
	}
}

// TestInstallAfterPrimaryRecopiesItsConf: a primary that re-copies its .conf (as
// flannel's init container does on every restart) after we wrapped it into a
// .conflist: the new .conf is the primary, gets wrapped again, and Uninstall
// restores that newest .conf.
func TestInstallAfterPrimaryRecopiesItsConf(t *testing.T) {
	dir := t.TempDir()
	entry := testEntry(t)
	v1 := readFile(t, "testdata/in/flannel-old.conf")
	v2 := bytes.Replace(v1, []byte(`"isDefaultGateway": true`), []byte(`"isDefaultGateway": true,
    "hairpinMode": true`), 1)
	conf := filepath.Join(dir, "10-flannel.conf")
	if err := os.WriteFile(conf, v1, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir, "10-flannel.conf", entry); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, v2, 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, err := FindPrimary(dir, "")
	if err != nil || p != conf {
		t.Fatalf("primary %s, %v; want the re-copied .conf (it sorts first)", p, err)
	}
	written, err := Install(dir, "10-flannel.conf", entry)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := Insert(v2, "10-flannel.conf", entry)
	if diff := cmp.Diff(string(want), string(readFile(t, written))); diff != "" {
		t.Errorf("re-wrapped (-want +got):\n%s", diff)
	}
	if _, err := Uninstall(dir, filepath.Base(written)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"10-flannel.conf": "-rw-r--r--\n" + string(v2)}, snapshot(t, dir)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestInstallNeverReplacesAnotherConflist: wrapping NAME.conf into NAME.conflist
// when another config already has that name is refused, naming both, and leaves
// the dir as it was; a NAME.conflist of our own earlier wrap is replaced as before.
func TestInstallNeverReplacesAnotherConflist(t *testing.T) {
	entry := testEntry(t)
	conf := `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`
	other := `{"cniVersion":"0.3.1","name":"other","plugins":[{"type":"bridge"}]}`
	dir := writeDir(t, map[string]string{"10-net.conf": conf, "10-net.conflist": other})
	before := snapshot(t, dir)
	_, err := Install(dir, "10-net.conf", entry)
	var inv *InvalidError
	if !errors.As(err, &inv) || err.Error() != "10-net.conf: wrapping it into a list would replace 10-net.conflist, another config already there; remove or rename one of the two" {
		t.Errorf("Install: %v, want an InvalidError naming both files", err)
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Errorf("dir changed (-before +after):\n%s", diff)
	}

	// Our earlier wrap, beside a .conf the primary wrote again: replaced.
	dir = writeDir(t, map[string]string{"10-net.conf": conf})
	if _, err := Install(dir, "10-net.conf", entry); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-net.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir, "10-net.conf", entry); err != nil {
		t.Errorf("re-wrap over our own earlier output: %v", err)
	}
}

// TestInstallThroughASymlink: a primary config that is a symbolic link (the CNI
// keeps the file elsewhere) stays a link; the file it points to gets the entry,
// and after Uninstall holds its bytes again.
func TestInstallThroughASymlink(t *testing.T) {
	entry := testEntry(t)
	data := readFile(t, "testdata/in/calico.conflist")
	target := filepath.Join(t.TempDir(), "calico.conflist")
	if err := os.WriteFile(target, data, 0o640); err != nil {
		t.Fatal(err)
	}
	dir := writeDir(t, map[string]string{"10-calico.conflist": "->" + target})
	written, err := Install(dir, "10-calico.conflist", entry)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := Insert(data, "10-calico.conflist", entry)
	if fi, err := os.Lstat(written); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("after Install %s is no longer a link (%v)", written, err)
	}
	if got := readFile(t, target); !bytes.Equal(got, want) {
		t.Errorf("the link's target does not hold the entry:\n%s", got)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o640 {
		t.Errorf("target mode %v, want 0640 kept", fi.Mode().Perm())
	}
	if _, err := Uninstall(dir, "10-calico.conflist"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(written); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("after Uninstall %s is no longer a link (%v)", written, err)
	}
	if got := readFile(t, target); !bytes.Equal(got, data) {
		t.Errorf("the link's target after Uninstall:\n%s\nwant the original bytes", got)
	}
}

// TestBackupReadIsBounded: a backup larger than a config may be is refused, not
// read whole.
func TestBackupReadIsBounded(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(BackupPath(dir, "10-x.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := FindBackup(dir, "10-x.conflist"); err == nil || !strings.Contains(err.Error(), "more than the 1048576 bytes") {
		t.Errorf("FindBackup of a 64 MiB backup: %v, want it refused", err)
	}
}
