package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLoadConfDirFindsTheEntryAsTheRuntimeWould covers the node layouts: chained
// in the primary conflist, standalone for Multus, a primary that sorts before the
// file holding the entry (the primary CNI wrote a new config), and no entry at all.
func TestLoadConfDirFindsTheEntryAsTheRuntimeWould(t *testing.T) {
	const ptp = `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"},{"type":"istio-cni","exclude_namespaces":["x"]}]}`
	for _, tc := range []struct {
		name     string
		files    map[string]string
		layout   string
		file     string
		warnings []string
		err      string
	}{
		{name: "chained", files: map[string]string{"10-pods.conflist": ptp}, layout: LayoutChained, file: "10-pods.conflist"},
		{name: "standalone", files: map[string]string{"istio-cni.conf": `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni"}`,
			"00-multus.conf": `{"cniVersion":"1.0.0","name":"multus","type":"multus"}`}, layout: LayoutStandalone, file: "istio-cni.conf"},
		{name: "primary-rewritten", files: map[string]string{"10-pods.conflist": ptp,
			"05-new.conflist": `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"}]}`},
			layout: LayoutChained, file: "10-pods.conflist", warnings: []string{"the runtime uses 05-new.conflist"}},
		{name: "not-last", files: map[string]string{"10-pods.conflist": `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"},{"type":"istio-cni"},{"type":"portmap"}]}`},
			layout: LayoutChained, file: "10-pods.conflist", warnings: []string{"istio-cni is not last in the chain"}},
		// libcni 1.3 on runs the .conf files of DIR/NAME after the list's plugins.
		{name: "chain-goes-on-in-plugin-dir", files: map[string]string{"10-pods.conflist": ptp,
			"pods/50-bandwidth.conf": `{"cniVersion":"1.0.0","name":"pods","type":"bandwidth"}`},
			layout: LayoutChained, file: "10-pods.conflist", warnings: []string{"10-pods.conflist: the runtime runs the plugins of the 1 config in its plugin directory"}},
		{name: "plugin-dir-of-another-file", files: map[string]string{"10-pods.conflist": ptp,
			"05-new.conflist": `{"cniVersion":"1.0.0","name":"new"}`,
			"new/10-ptp.conf": `{"cniVersion":"1.0.0","name":"new","type":"ptp"}`},
			layout: LayoutChained, file: "10-pods.conflist", warnings: []string{"05-new.conflist: the runtime runs the plugins of the 1 config in its plugin directory"}},
		{name: "entry-gone", files: map[string]string{"10-pods.conflist": `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"}]}`},
			err: "no istio-cni entry in the CNI configs of DIR (10-pods.conflist)"},
		{name: "empty", files: map[string]string{}, err: "no CNI config in DIR"},
		{name: "bad-entry", files: map[string]string{"10-pods.conflist": `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"},{"type":"istio-cni","plugin_log_level":"loud"}]}`},
			err: "istio-cni entry in DIR/10-pods.conflist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg, src, err := LoadConfDir(dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), dir, "DIR"), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if src.Layout != tc.layout || src.Path != filepath.Join(dir, tc.file) || cfg.Type != PluginType {
				t.Errorf("got %+v (type %q), want layout %s in %s", src, cfg.Type, tc.layout, tc.file)
			}
			if len(src.Warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %q", src.Warnings, tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(src.Warnings[i], w) {
					t.Errorf("warning %q lacks %q", src.Warnings[i], w)
				}
			}
		})
	}
}

func TestParseNetworks(t *testing.T) {
	for in, want := range map[string]string{
		"istio-cni":                              "/istio-cni",
		"ns1/istio-cni@eth1, macvlan":            "ns1/istio-cni,/macvlan",
		`[{"name":"istio-cni","namespace":"a"}]`: "a/istio-cni",
		"":                                       "",
	} {
		sels, err := ParseNetworks(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		var got []string
		for _, s := range sels {
			got = append(got, s.Namespace+"/"+s.Name)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("ParseNetworks(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := ParseNetworks("[{"); err == nil {
		t.Error("broken JSON accepted")
	}
}

// TestLoadConfDirPassesOverANamedPipeAtOnce: a FIFO with a config's name in the
// CNI config directory (a file another actor controls) is passed over as the
// agent passes it over, not waited on until some process writes to it: the
// doctor would hang past its --timeout.
func TestLoadConfDirPassesOverANamedPipeAtOnce(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "05-pipe.conflist")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const ptp = `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"},{"type":"istio-cni"}]}`
	if err := os.WriteFile(filepath.Join(dir, "10-pods.conflist"), []byte(ptp), 0o644); err != nil {
		t.Fatal(err)
	}
	type loaded struct {
		src ConfigSource
		err error
	}
	got := make(chan loaded, 1)
	go func() { _, src, err := LoadConfDir(dir); got <- loaded{src, err} }()
	select {
	case l := <-got:
		if l.err != nil || l.src.Path != filepath.Join(dir, "10-pods.conflist") {
			t.Errorf("LoadConfDir beside a named pipe: %+v, %v; want the entry in 10-pods.conflist", l.src, l.err)
		}
	case <-time.After(5 * time.Second):
		// A writer ends the blocked read, so the test's goroutine returns.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		t.Fatal("LoadConfDir still waits to read a named pipe in the CNI config directory")
	}
}

// TestHintsNameTheAgentsNamespace: the doctor runs in an agent's pod, and the
// commands its hints give name that pod's namespace (POD_NAMESPACE, which the
// chart sets), not kube-system whatever the install.
func TestHintsNameTheAgentsNamespace(t *testing.T) {
	for _, tc := range []struct{ env, want string }{{"istio-system", "-n istio-system "}, {"", "-n kube-system "}} {
		t.Run("POD_NAMESPACE="+tc.env, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.env)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "10-pods.conflist"), []byte(`{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp"}]}`), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := LoadConfDir(dir)
			if err == nil || !strings.Contains(err.Error(), "kubectl logs "+tc.want) {
				t.Errorf("error %v, want its command with %q", err, tc.want)
			}
		})
	}
}
