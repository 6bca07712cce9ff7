package agent

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The tests here run the agent beside a primary CNI's own agent, which writes and
// rewrites its config in its own way.

// TestAgentPutsTheEntryBackWhenThePrimaryRewritesTheFileItsConfigLinksTo: a
// primary that keeps its config elsewhere and links it into the conf dir (the
// agent writes the entry into the link's file, and the link stays) rewrites that
// file when its agent restarts: the entry must come back, as for a file in the
// conf dir. The rewrite happens in the link's directory (here beside the conf dir,
// and in a subdirectory of it), where the conf dir's watch sees nothing: before,
// the entry stayed out, pods started uncaptured, and the agent stayed ready.
func TestAgentPutsTheEntryBackWhenThePrimaryRewritesTheFileItsConfigLinksTo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// target is where the primary keeps its config, given the conf dir.
		target func(confDir string) string
	}{
		{"a directory beside the conf dir", func(confDir string) string {
			return filepath.Join(filepath.Dir(confDir), "calico", "10-calico.conflist")
		}},
		{"a subdirectory of the conf dir", func(confDir string) string {
			return filepath.Join(confDir, "calico", "calico.conflist")
		}},
		{"the conf dir, under a name the runtime does not load", func(confDir string) string {
			return filepath.Join(confDir, "calico.conflist.real")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			target := tc.target(n.confDir)
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, target, []byte(calicoConflist), 0o644)
			link := filepath.Join(n.confDir, "10-calico.conflist")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}

			p := n.startAgent(t)
			p.waitReady(t)
			if !hasEntryLast(link) {
				t.Fatalf("after the install %s does not end with the entry: %v", link, pluginTypes(t, link))
			}

			for i := range 3 {
				writeLikeACNI(t, target, []byte(calicoConflist))
				deadline := time.Now().Add(5 * time.Second)
				for !hasEntryLast(link) {
					if time.Now().After(deadline) {
						t.Fatalf("rewrite %d of the linked file: the entry is not back after 5s (ready: %v)", i+1, p.ready())
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("%s is no longer a link (%v)", link, err)
			}

			p.stop(t)
			if data, err := os.ReadFile(target); err != nil || string(data) != calicoConflist {
				t.Errorf("after the uninstall the linked file holds (%v):\n%s\nwant the primary's bytes", err, data)
			}
			if diff := cmp.Diff(calicoConflist, readFileString(t, link)); diff != "" {
				t.Errorf("the config read through the link after the uninstall (-want +got):\n%s", diff)
			}
		})
	}
}

func readFileString(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestAgentIsNotReadyWhileThePrimaryKeepsDroppingTheEntry: a primary that rewrites
// its config at every change in the directory (Cilium with cni.exclusive=true)
// drops the entry as fast as the agent puts it back, so the config the runtime
// loads lacks it nearly all the time and pods start unredirected. The agent is not
// ready while that goes on (more than REVERT_WARN_COUNT re-inserts within
// REVERT_WARN_WINDOW), /readyz naming the primary's rewrites and Cilium's setting,
// and ready again once a window passes without them. Before, it stayed ready
// throughout.
func TestAgentIsNotReadyWhileThePrimaryKeepsDroppingTheEntry(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)
	p := n.startAgent(t, "REVERT_WARN_COUNT=3", "REVERT_WARN_WINDOW=3s")
	p.waitReady(t)

	// The exclusive primary: whenever its file holds another plugin, it writes its
	// own config again.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if hasEntryLast(path) {
				writeLikeACNI(t, path, []byte(calicoConflist))
			}
			time.Sleep(time.Millisecond)
		}
	}()
	eventually(t, 10*time.Second, "the agent is not ready, naming the primary's rewrites", func() bool {
		code, b := p.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(b, "keeps rewriting") && strings.Contains(b, "cni.exclusive=false")
	})
	close(stop)
	<-done
	// No more rewrites: the entry is back, and ready within a window.
	eventually(t, 10*time.Second, "the agent is ready again once the rewrites stopped", p.ready)
	if !hasEntryLast(path) {
		t.Errorf("ready again, but %s does not end with the entry: %v", path, pluginTypes(t, path))
	}
}

// TestAgentLeavesAListWhoseChainGoesOnInItsPluginDirAndIsNotReady: a primary that
// writes a list of CNI spec 1.1's form, its plugins in a directory named after its
// network (05-net.conflist, {"name":"net"}, and net/10-bridge.conf), is the network the runtime loads
// (libcni 1.3 on, as containerd 2.4 loads configs), and an entry in that file would not be last in
// its chain. The agent edits no file, is not ready, /readyz naming the directory
// and what to change, and installs once the primary lists its plugins in the file.
// Before, the list was passed over as broken and the entry went into the next
// config, which the runtime does not use: pods were not redirected, and the agent
// was ready.
func TestAgentLeavesAListWhoseChainGoesOnInItsPluginDirAndIsNotReady(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pluginDir := filepath.Join(n.confDir, "net")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(pluginDir, "10-bridge.conf"), []byte(`{"cniVersion":"1.1.0","type":"bridge","bridge":"cni0"}`), 0o644)
	const inDir = `{"cniVersion":"1.1.0","name":"net"}`
	list := filepath.Join(n.confDir, "05-net.conflist")
	writeFile(t, list, []byte(inDir), 0o644)
	n.writeCalico(t) // 10-calico.conflist sorts after 05-net.conflist
	before := snapshot(t, n.confDir)

	p := n.startAgent(t)
	eventually(t, 10*time.Second, "/readyz names the plugin directory", func() bool {
		code, body := p.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "05-net.conflist: the runtime runs the plugins of the 1 config in its plugin directory "+pluginDir) &&
			strings.Contains(body, `move them into its "plugins" list`)
	})
	if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
		t.Errorf("the agent edited the conf dir (-before +after):\n%s", diff)
	}

	// The primary lists its plugin in the file: the entry goes there, last.
	os.Remove(filepath.Join(pluginDir, "10-bridge.conf"))
	writeLikeACNI(t, list, []byte(`{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"bridge","bridge":"cni0"}]}`))
	p.waitReady(t)
	if !hasEntryLast(list) {
		t.Errorf("%s does not end with the entry: %v", list, pluginTypes(t, list))
	}
	if got := pluginTypes(t, filepath.Join(n.confDir, "10-calico.conflist")); countType(got, PluginType) != 0 {
		t.Errorf("10-calico.conflist, not the runtime's network, holds the entry: %v", got)
	}
}

// TestAgentLeavesNoBackupOfAConfigThePrimaryRemoved: the primary CNI removes its
// config (its own uninstall, or a new primary taking over with a file of its own)
// while the agent's entry is in it. The agent keeps the original of every config it
// inserted into (.istio-cni.NAME.orig); once that config is gone the backup is of no
// use, and an uninstall must not leave it: the conf dir holds what the primaries
// left. Before, the backup stayed for good, whether the entry was waiting for a
// primary or had moved to another file.
func TestAgentLeavesNoBackupOfAConfigThePrimaryRemoved(t *testing.T) {
	t.Parallel()
	t.Run("no primary left", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		path := n.writeCalico(t)
		p := n.startAgent(t)
		p.waitReady(t)
		os.Remove(path)
		eventually(t, 5*time.Second, "not ready without a primary", func() bool { return !p.ready() })
		p.stop(t)
		if left := snapshot(t, n.confDir); len(left) > 0 {
			t.Errorf("conf dir after the uninstall holds %v, want nothing", keys(left))
		}
	})
	t.Run("another primary took over", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		path := n.writeCalico(t)
		p := n.startAgent(t)
		p.waitReady(t)
		cilium := filepath.Join(n.confDir, "05-cilium.conflist")
		writeLikeACNI(t, cilium, []byte(calicoConflist))
		os.Remove(path)
		eventually(t, 5*time.Second, "the entry is in the new primary", func() bool { return hasEntryLast(cilium) })
		p.waitReady(t)
		p.stop(t)
		if diff := cmp.Diff(map[string]fileState{"05-cilium.conflist": {0o644, calicoConflist}}, snapshot(t, n.confDir)); diff != "" {
			t.Errorf("conf dir after the uninstall (-want +got):\n%s", diff)
		}
	})
}

// TestAgentNamedAJSONConfigStaysReadyAfterWrappingIt: CNI_CONF_NAME may name a
// .json config, which the agent wraps into NAME.conflist as it wraps a .conf. The
// agent must find its wrap under that name at every later look, as it does for a
// .conf, stay ready, and put the .json back on the uninstall. Before, the next look
// found no NAME.json, waited for it as for a primary not yet written, and the agent
// was not ready for as long as it ran.
func TestAgentNamedAJSONConfigStaysReadyAfterWrappingIt(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	const ptp = `{"cniVersion":"1.0.0","name":"ptp","type":"ptp","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}`
	writeFile(t, filepath.Join(n.confDir, "10-ptp.json"), []byte(ptp), 0o644)
	before := snapshot(t, n.confDir)
	p := n.startAgent(t, "CNI_CONF_NAME=10-ptp.json")
	p.waitReady(t)
	list := filepath.Join(n.confDir, "10-ptp.conflist")
	if !hasEntryLast(list) {
		t.Fatalf("%s does not end with the entry", list)
	}
	// Later looks (a change in the directory) find the wrap.
	writeFile(t, filepath.Join(n.confDir, "99-loopback.conf"), []byte(`{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`), 0o644)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if code, body := p.readyz(); code != http.StatusOK {
			t.Fatalf("not ready after the wrap: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	os.Remove(filepath.Join(n.confDir, "99-loopback.conf"))
	p.stop(t)
	if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
		t.Errorf("conf dir after the uninstall (-before +after):\n%s", diff)
	}
}
