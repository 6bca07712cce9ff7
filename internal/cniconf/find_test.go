package cniconf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/lease"
)

// writeDir fills a fresh temporary directory: a value starting with "->" makes a
// symlink to that target, "/" a directory, "|" a FIFO, anything else a file.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		var err error
		switch {
		case content == "/":
			err = os.Mkdir(p, 0o755)
		case content == "|":
			err = syscall.Mkfifo(p, 0o644)
		case len(content) > 2 && content[:2] == "->":
			err = os.Symlink(content[2:], p)
		default:
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindPrimary(t *testing.T) {
	const (
		list   = `{"cniVersion":"0.3.1","name":"k8s","plugins":[{"type":"calico"},{"type":"portmap"}]}`
		single = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`
		ours   = `{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni"}`
	)
	tests := []struct {
		name        string
		files       map[string]string
		confName    string
		want        string
		wantSkipped []string
		wantErr     string
		wantNone    bool
	}{
		{name: "lexical order, not age or type", files: map[string]string{"20-b.conflist": list, "10-a.conf": single, "9-z.conflist": list}, want: "10-a.conf"},
		{name: "broken first file skipped with its reason", files: map[string]string{"05-broken.conflist": list[:40], "10-calico.conflist": list},
			want: "10-calico.conflist", wantSkipped: []string{"05-broken.conflist: invalid JSON at offset 40: unexpected end of JSON input"}},
		{name: "every kind of unusable file skipped", files: map[string]string{
			"01-empty.conf":             "",
			"02-list-in.conf":           list,
			"03-not-list.conflist":      `{"name":"x","plugins":{}}`,
			"05-istio-cni.conf":         ours,
			"06-dir.conf":               "/",
			"07-notes.txt":              single,
			".istio-cni.08-a.conf.orig": single,
			"09-ok.json":                single,
		}, want: "09-ok.json", wantSkipped: []string{
			"01-empty.conf: empty file",
			`02-list-in.conf: no "type": this is a plugin list, name it .conflist`,
			`03-not-list.conflist: "plugins" is not a list (it is an object)`,
			"05-istio-cni.conf: is istio-cni's own config, not a primary network",
		}},
		{name: "a link to a path this container does not see stops the search (the runtime may follow it)", files: map[string]string{"04-dangling.conflist": "->/nonexistent", "09-ok.json": single},
			wantErr: "DIR/04-dangling.conflist is a symbolic link to /nonexistent, which this container does not see: mount that path into the agent, or remove the link"},
		{name: "a FIFO is skipped, not waited on", files: map[string]string{"00-fifo.conf": "|", "10-calico.conflist": list},
			want: "10-calico.conflist", wantSkipped: []string{"00-fifo.conf: is not a regular file (named pipe)"}},
		{name: "our standalone list is not a primary", files: map[string]string{"00-istio.conflist": `{"name":"i","plugins":[{"type":"istio-cni"}]}`, "10-flannel.conflist": list},
			want: "10-flannel.conflist", wantSkipped: []string{"00-istio.conflist: holds only istio-cni plugins: our own config, not a primary network"}},
		{name: "a list without plugins, nor a plugin dir, is skipped (the runtime refuses it)", files: map[string]string{"05-none.conflist": `{"cniVersion":"1.1.0","name":"none"}`, "10-calico.conflist": list},
			want: "10-calico.conflist", wantSkipped: []string{`05-none.conflist: no "plugins" list`}},
		{name: "json extension counts", files: map[string]string{"10-ptp.json": single}, want: "10-ptp.json"},
		{name: "empty dir", files: map[string]string{}, wantNone: true},
		{name: "only invalid files", files: map[string]string{"10-x.conflist": "{"}, wantNone: true, wantSkipped: []string{"10-x.conflist: invalid JSON at offset 1: unexpected end of JSON input"}},
		{name: "CNI_CONF_NAME picks exactly that file", files: map[string]string{"10-a.conf": single, "20-b.conflist": list}, confName: "20-b.conflist", want: "20-b.conflist"},
		{name: "CNI_CONF_NAME of a .conf we wrapped finds the .conflist", files: map[string]string{"10-flannel.conflist": list}, confName: "10-flannel.conf", want: "10-flannel.conflist"},
		{name: "CNI_CONF_NAME of a .conflist finds the .conf (as Istio's)", files: map[string]string{"10-flannel.conf": single}, confName: "10-flannel.conflist", want: "10-flannel.conf"},
		{name: "CNI_CONF_NAME of a .json we wrapped finds the .conflist", files: map[string]string{"10-ptp.conflist": list}, confName: "10-ptp.json", want: "10-ptp.conflist"},
		{name: "CNI_CONF_NAME of a .json prefers the .json when both exist", files: map[string]string{"10-ptp.json": single, "10-ptp.conflist": list}, confName: "10-ptp.json", want: "10-ptp.json"},
		{name: "CNI_CONF_NAME prefers the .conf when both exist", files: map[string]string{"10-flannel.conf": single, "10-flannel.conflist": list}, confName: "10-flannel.conf", want: "10-flannel.conf"},
		{name: "CNI_CONF_NAME missing: wait for it", files: map[string]string{"10-a.conf": single}, confName: "20-b.conflist", wantNone: true},
		{name: "CNI_CONF_NAME invalid", files: map[string]string{"20-b.conflist": `{"name":"x","plugins":[]}`}, confName: "20-b.conflist", wantErr: `20-b.conflist: "plugins" is empty`},
		{name: "CNI_CONF_NAME not a config name", files: map[string]string{}, confName: "../etc/passwd", wantErr: `CNI_CONF_NAME "../etc/passwd": not a file name ending in .conf, .conflist or .json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, tt.files)
			path, skipped, err := FindPrimary(dir, tt.confName)
			var gotSkipped, wantSkipped []string
			for _, s := range skipped {
				if !strings.Contains(s.String(), s.Name) {
					t.Errorf("reason %q does not name the file %s", s, s.Name)
				}
				gotSkipped = append(gotSkipped, s.String())
			}
			for _, s := range tt.wantSkipped {
				wantSkipped = append(wantSkipped, strings.ReplaceAll(s, "DIR", dir))
			}
			if diff := cmp.Diff(wantSkipped, gotSkipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			switch {
			case tt.wantNone:
				if !errors.Is(err, ErrNoPrimary) {
					t.Errorf("got %q, %v; want ErrNoPrimary", path, err)
				}
			case tt.wantErr != "":
				if err == nil || err.Error() != strings.ReplaceAll(tt.wantErr, "DIR", dir) || errors.Is(err, ErrNoPrimary) {
					t.Errorf("got %q, %v; want error %s", path, err, tt.wantErr)
				}
			default:
				if err != nil || path != filepath.Join(dir, tt.want) {
					t.Errorf("got %q, %v; want %s", path, err, tt.want)
				}
			}
		})
	}
	if _, _, err := FindPrimary(filepath.Join(t.TempDir(), "absent"), ""); !errors.Is(err, ErrNoPrimary) {
		t.Errorf("absent dir: %v, want ErrNoPrimary (the runtime may create it later)", err)
	}
}

// TestFindPrimaryDoesNotPassOverAConfigItCannotRead: a config that cannot be opened
// at the moment (here a lease makes the open fail with EAGAIN; an agent at its
// RLIMIT_NOFILE gets EMFILE, one at the node's file-max ENFILE) is not passed over
// as a broken one is: nothing is known of its content, and it may well be the
// primary the runtime uses. The search stops with the error, naming the file, and
// reports no ErrNoPrimary. Before, it went on to the next file, where the agent
// then put our entry (and took it out of the real primary).
func TestFindPrimaryDoesNotPassOverAConfigItCannotRead(t *testing.T) {
	const (
		list   = `{"cniVersion":"0.3.1","name":"k8s","plugins":[{"type":"calico"}]}`
		single = `{"cniVersion":"0.3.1","name":"lo","type":"loopback"}`
	)
	for _, tt := range []struct {
		name  string
		files map[string]string
	}{
		{name: "the first of two configs", files: map[string]string{"10-calico.conflist": list, "99-loopback.conf": single}},
		{name: "the only config", files: map[string]string{"10-calico.conflist": list}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, tt.files)
			lease.Hold(t, filepath.Join(dir, "10-calico.conflist"))
			path, skipped, err := FindPrimary(dir, "")
			if err == nil || errors.Is(err, ErrNoPrimary) || !errors.Is(err, syscall.EWOULDBLOCK) || !strings.Contains(err.Error(), "10-calico.conflist") {
				t.Errorf("got %q, %v; want the open's error (EAGAIN), naming 10-calico.conflist, and no ErrNoPrimary", path, err)
			}
			if len(skipped) != 0 {
				t.Errorf("skipped %v, want nothing passed over", skipped)
			}
		})
	}
	// The standalone config's checks alike: a config the agent cannot read may be
	// one a runtime (or Multus) reads as the node's network.
	dir := writeDir(t, map[string]string{"10-calico.conflist": list})
	lease.Hold(t, filepath.Join(dir, "10-calico.conflist"))
	if after, err := ConfigsAfter(dir, "00-istio-cni.conf"); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("ConfigsAfter: %v, %v; want the open's error (EAGAIN)", after, err)
	}
	if before, err := NamedBefore(dir, "zz-istio-cni.conf", "k8s"); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("NamedBefore: %v, %v; want the open's error (EAGAIN)", before, err)
	}
}

// TestAConfigTheRuntimeLoadsButTheAgentWillNotEditStopsTheSearch: a list with its
// "plugins" key twice is one the runtime loads (libcni decodes it into a map: the
// last list counts), but not one the agent edits (which list a person meant is a
// guess). Passed over as a broken file, the entry went into the next config, which
// the runtime does not use: pods were not redirected. The search stops at it,
// naming the problem.
func TestAConfigTheRuntimeLoadsButTheAgentWillNotEditStopsTheSearch(t *testing.T) {
	const (
		dup  = `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"}],"plugins":[{"type":"calico"}]}`
		next = `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"calico"}]}`
	)
	dir := writeDir(t, map[string]string{"05-dup.conflist": dup, "10-calico.conflist": next})
	if l, err := libcni.ConfListFromFile(filepath.Join(dir, "05-dup.conflist")); err != nil || len(l.Plugins) != 1 || l.Plugins[0].Network.Type != "calico" {
		t.Fatalf("libcni does not load 05-dup.conflist with its last plugins, the test's premise: %v", err)
	}
	path, skipped, err := FindPrimary(dir, "")
	const want = `05-dup.conflist: key "plugins" appears 2 times, which libcni, as the runtime reads configs, accepts: this agent neither edits it nor passes it over for a later file; fix it`
	var invalid *InvalidError
	if err == nil || err.Error() != want || errors.Is(err, ErrNoPrimary) || errors.As(err, &invalid) || len(skipped) != 0 {
		t.Errorf("FindPrimary: %q, %v, skipped %v\nwant the error (no ErrNoPrimary, no *InvalidError, nothing skipped):\n%s", path, err, skipped, want)
	}
	if after, err := ConfigsAfter(dir, "00-istio-cni.conf"); err != nil || !slices.Equal(after, []string{"05-dup.conflist", "10-calico.conflist"}) {
		t.Errorf("ConfigsAfter: %v, %v; want both configs", after, err)
	}
}

// TestAListWhoseChainGoesOnInItsPluginDirIsTheRuntimesButNotEdited: libcni (1.3 on,
// which recent containerd 2 releases load configs with) appends to a .conflist's chain the .conf
// files of its plugin directory, DIR/NAME for the network name NAME, unless the list
// sets loadOnlyInlinedPlugins; a list may then have no "plugins" of its own. The
// runtime loads such a list as the node's network (the test asks libcni), so the
// search for the primary stops at it, naming the directory: an entry put last in the
// file would run before those plugins, and a list without "plugins" has no place for
// it. Before, a list without "plugins" was passed over as broken and the entry went
// into the next file, which the runtime does not use: pods were not redirected and
// the agent was ready; a list with "plugins" got the entry in the middle of the chain.
func TestAListWhoseChainGoesOnInItsPluginDirIsTheRuntimesButNotEdited(t *testing.T) {
	const (
		next   = `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"calico"}]}`
		bridge = `{"cniVersion":"1.0.0","type":"bridge","bridge":"cni0"}`
	)
	tests := []struct {
		name     string
		list     string            // 10-net.conflist
		dir      map[string]string // the files of its plugin dir net/
		confName string
		wantErr  string // empty: 10-net.conflist is the primary, to edit
	}{
		{name: "a list without plugins of its own", list: `{"cniVersion":"1.1.0","name":"net"}`, dir: map[string]string{"20-tuning.conf": `{"type":"tuning"}`, "10-bridge.conf": bridge},
			wantErr: `10-net.conflist: the runtime runs the plugins of the 2 configs in its plugin directory DIR/net (10-bridge.conf first) after those the file lists (none), so an istio-cni entry in the file would not be last in the chain; move them into its "plugins" list, or set "loadOnlyInlinedPlugins": true if they are not this network's`},
		{name: "a list with plugins of its own", list: `{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"portmap"}]}`, dir: map[string]string{"10-bridge.conf": bridge},
			wantErr: `10-net.conflist: the runtime runs the plugins of the 1 config in its plugin directory DIR/net (10-bridge.conf first) after those the file lists (portmap), so an istio-cni entry in the file would not be last in the chain; move them into its "plugins" list, or set "loadOnlyInlinedPlugins": true if they are not this network's`},
		{name: "named by CNI_CONF_NAME", list: `{"cniVersion":"1.1.0","name":"net"}`, dir: map[string]string{"10-bridge.conf": bridge}, confName: "10-net.conflist",
			wantErr: `10-net.conflist: the runtime runs the plugins of the 1 config in its plugin directory DIR/net (10-bridge.conf first) after those the file lists (none), so an istio-cni entry in the file would not be last in the chain; move them into its "plugins" list, or set "loadOnlyInlinedPlugins": true if they are not this network's`},
		{name: "loadOnlyInlinedPlugins: the directory does not count", list: `{"cniVersion":"1.1.0","name":"net","loadOnlyInlinedPlugins":true,"plugins":[{"type":"bridge"}]}`, dir: map[string]string{"10-bridge.conf": bridge}},
		{name: "loadOnlyInlinedPlugins as a string", list: `{"cniVersion":"1.1.0","name":"net","loadOnlyInlinedPlugins":"True","plugins":[{"type":"bridge"}]}`, dir: map[string]string{"10-bridge.conf": bridge}},
		{name: "a plugin dir without .conf files", list: `{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"bridge"}]}`, dir: map[string]string{"README.md": "notes", "10-bridge.json": bridge, "old.conf": "/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, map[string]string{"10-net.conflist": tt.list, "20-calico.conflist": next, "net": "/"})
			for name, content := range tt.dir {
				p := filepath.Join(dir, "net", name)
				var err error
				if content == "/" {
					err = os.Mkdir(p, 0o755)
				} else {
					err = os.WriteFile(p, []byte(content), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// What the runtime makes of the file: its chain, from the file and the dir.
			rt, err := libcni.ConfListFromFile(filepath.Join(dir, "10-net.conflist"))
			if err != nil {
				t.Fatalf("libcni does not load 10-net.conflist, the test's premise: %v", err)
			}
			if inline := strings.Count(tt.list, `"type"`); (tt.wantErr != "") != (len(rt.Plugins) > inline) {
				t.Fatalf("libcni's chain has %d plugins, %d of them from the file: the test's premise is wrong", len(rt.Plugins), inline)
			}

			path, skipped, err := FindPrimary(dir, tt.confName)
			if len(skipped) != 0 {
				t.Errorf("skipped %v: the runtime loads 10-net.conflist, so it is not passed over", skipped)
			}
			want := strings.ReplaceAll(tt.wantErr, "DIR", dir)
			if tt.wantErr == "" {
				if err != nil || path != filepath.Join(dir, "10-net.conflist") {
					t.Errorf("FindPrimary: %q, %v; want 10-net.conflist", path, err)
				}
				return
			}
			var invalid *InvalidError
			if err == nil || err.Error() != want || errors.Is(err, ErrNoPrimary) || errors.As(err, &invalid) {
				t.Errorf("FindPrimary: %q, %v\nwant the error (no ErrNoPrimary, no *InvalidError, which would pass it over):\n%s", path, err, want)
			}
			// The same file as the one a standalone config would sort before.
			if after, err := ConfigsAfter(dir, "00-istio-cni.conf"); err != nil || !slices.Equal(after, []string{"10-net.conflist", "20-calico.conflist"}) {
				t.Errorf("ConfigsAfter: %v, %v; want both configs", after, err)
			}
			// Install, asked directly, leaves it as it is.
			if _, err := Install(dir, "10-net.conflist", []byte(`{"type":"istio-cni"}`)); err == nil || err.Error() != want {
				t.Errorf("Install: %v, want %s", err, want)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "10-net.conflist")); string(got) != tt.list {
				t.Errorf("10-net.conflist changed:\n%s", got)
			}
		})
	}

	// A .conf wrapped into a list would gain the plugin dir of its network name: the
	// runtime reads a .conf alone, a .conflist with its dir.
	t.Run("a .conf whose list would go on in a plugin dir is not wrapped", func(t *testing.T) {
		const conf = `{"cniVersion":"1.0.0","name":"net","type":"bridge"}`
		dir := writeDir(t, map[string]string{"10-net.conf": conf, "net": "/"})
		if err := os.WriteFile(filepath.Join(dir, "net", "10-tuning.conf"), []byte(`{"type":"tuning"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if path, _, err := FindPrimary(dir, ""); err != nil || filepath.Base(path) != "10-net.conf" {
			t.Fatalf("FindPrimary: %q, %v; want 10-net.conf (a .conf alone: the runtime reads no dir for it)", path, err)
		}
		want := `10-net.conflist: the runtime runs the plugins of the 1 config in its plugin directory ` + filepath.Join(dir, "net") +
			` (10-tuning.conf first) after those the file lists (bridge, istio-cni), so an istio-cni entry in the file would not be last in the chain; move them into its "plugins" list, or set "loadOnlyInlinedPlugins": true if they are not this network's`
		if _, err := Install(dir, "10-net.conf", []byte(`{"type":"istio-cni"}`)); err == nil || err.Error() != want {
			t.Errorf("Install: %v\nwant %s", err, want)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "10-net.conf")); string(got) != conf {
			t.Errorf("10-net.conf changed:\n%s", got)
		}
		if _, err := os.Stat(filepath.Join(dir, "10-net.conflist")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("10-net.conflist written: %v", err)
		}
	})
}
