package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/fsnotify/fsnotify"
	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

func TestAgentInstallsThenSIGTERMLeavesTheConfDirAsItWas(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		files   map[string]string // the node's config dir before
		env     []string
		holder  string // the file that holds our entry while installed
		wantTop []string
	}{
		{"calico conflist", map[string]string{"10-calico.conflist": calicoConflist, "calico-kubeconfig": "kc"}, nil,
			"10-calico.conflist", []string{"calico", "portmap", "istio-cni"}},
		{"flannel conf is wrapped and comes back as the conf", map[string]string{"10-flannel.conf": flannelConf}, nil,
			"10-flannel.conflist", []string{"flannel", "istio-cni"}},
		{"CNI_CONF_NAME picks a file that is not first", map[string]string{"05-other.conflist": calicoConflist, "10-calico.conflist": calicoConflist},
			[]string{"CNI_CONF_NAME=10-calico.conflist"}, "10-calico.conflist", []string{"calico", "portmap", "istio-cni"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			for name, data := range tc.files {
				writeFile(t, filepath.Join(n.confDir, name), []byte(data), 0o640)
			}
			before := snapshot(t, n.confDir)
			p := n.startAgent(t, tc.env...)
			p.waitReady(t)

			if got := pluginTypes(t, filepath.Join(n.confDir, tc.holder)); !cmp.Equal(got, tc.wantTop) {
				t.Errorf("%s plugins = %v, want %v", tc.holder, got, tc.wantTop)
			}
			if fi, err := os.Stat(filepath.Join(n.confDir, tc.holder)); err != nil || fi.Mode().Perm() != 0o640 {
				t.Errorf("%s mode = %v (%v), want the primary's 0640", tc.holder, fi.Mode(), err)
			}
			for _, b := range []string{"istio-cni", "istio-iptables"} {
				src, _ := os.ReadFile(filepath.Join(built.source, b))
				dst, err := os.ReadFile(filepath.Join(n.binDir, b))
				fi, _ := os.Stat(filepath.Join(n.binDir, b))
				if err != nil || !bytes.Equal(src, dst) || fi.Mode().Perm() != 0o755 {
					t.Errorf("%s not installed as a copy of the image's with mode 0755 (%v)", b, err)
				}
			}
			kcPath := filepath.Join(n.runDir, "istio-cni-kubeconfig")
			fi, err := os.Stat(kcPath)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("kubeconfig %s: mode %v, %v; want 0600", kcPath, fi.Mode(), err)
			}
			kc, err := kube.LoadKubeconfig(kcPath)
			if err != nil || kc.Token != "token-1" || kc.Server != "https://127.0.0.1:6443" || !bytes.Equal(kc.CAData, n.ca) {
				t.Errorf("kubeconfig as the plugin reads it: %+v, %v", kc, err)
			}
			if v := p.metric(t, `istio_cni_installs_total{result="SUCCESS"}`); v != 1 {
				t.Errorf("istio_cni_installs_total = %v, want 1", v)
			}
			if v := p.metric(t, "istio_cni_install_ready"); v != 1 {
				t.Errorf("istio_cni_install_ready = %v, want 1", v)
			}

			// The plugin keeps its TLS session to the API server in the run dir, and
			// a plugin killed mid-write leaves a temporary file: the uninstall
			// removes both with the kubeconfig they were made under.
			writeFile(t, filepath.Join(n.runDir, plugin.TLSSessionName), []byte("session"), 0o600)
			writeFile(t, filepath.Join(n.runDir, "."+plugin.TLSSessionName+".tmp-123"), []byte("part"), 0o600)

			p.stop(t)
			if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
				t.Errorf("conf dir after uninstall differs from before (-before +after):\n%s", diff)
			}
			// The plugin's binary stays, for the DELs of the pods it set up
			// (TestADELOfAPodSetUpBeforeTheUninstallSucceeds).
			if left := keys(snapshot(t, n.binDir)); !slices.Equal(left, []string{"istio-cni"}) {
				t.Errorf("bin dir holds %v after the uninstall, want the plugin's binary alone", left)
			}
			if left := snapshot(t, n.runDir); len(left) != 0 {
				t.Errorf("run dir still holds %v", keys(left))
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestAgentPutsTheEntryBackWhenThePrimaryRewritesItsConfig(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)
	p := n.startAgent(t, "REVERT_WARN_COUNT=3")
	p.waitReady(t)

	const rewrites = 10
	var took []time.Duration
	for i := range rewrites {
		start := time.Now()
		if i%2 == 0 {
			writeLikeACNI(t, path, []byte(calicoConflist))
		} else {
			// Some daemons truncate and write in place: the agent sees a partial file
			// first and must wait for the whole one.
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			half := len(calicoConflist) / 2
			f.WriteString(calicoConflist[:half])
			time.Sleep(time.Millisecond)
			f.WriteString(calicoConflist[half:])
			f.Close()
		}
		eventually(t, 5*time.Second, "the entry is back", func() bool { return hasEntryLast(path) })
		took = append(took, time.Since(start))
	}
	t.Logf("entry back after a rewrite in %v", took)
	eventually(t, 5*time.Second, "the re-inserts are counted", func() bool {
		return p.metric(t, "istio_cni_config_reinserts_total") == rewrites
	})
	line := p.waitLog(t, "a warning with a hint", `level=WARN msg="the primary CNI keeps rewriting 10-calico.conflist[^"]*Configure the primary CNI`)
	t.Logf("warning: %s", line)
	// Each rewrite came within a second of the entry's re-insert, more than
	// REVERT_WARN_COUNT times: not ready (TestAgentIsNotReadyWhileThePrimaryKeepsDroppingTheEntry).
	if p.ready() {
		t.Error("ready after 10 drops of the entry within a second of its re-insert, REVERT_WARN_COUNT=3")
	}
}

func TestAgentRestoresDeletedOrReplacedFilesWhileTheRuntimeExecsThePlugin(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t)
	p.waitReady(t)
	plugin := filepath.Join(n.binDir, "istio-cni")
	want, _ := os.ReadFile(filepath.Join(built.source, "istio-cni"))
	installed := func() bool {
		got, err := os.ReadFile(plugin)
		return err == nil && bytes.Equal(got, want)
	}

	// The "older builds" are written before the exec loop starts: a file this test
	// process has open for writing would leak into the children it forks and make
	// their exec fail with ETXTBSY (golang/go#22315), which is not what is tested.
	old := append(append([]byte{}, want...), []byte("older-build")...)
	var olds []string
	for i := range 5 {
		p := filepath.Join(n.binDir, fmt.Sprintf(".old-%d", i))
		writeFile(t, p, old, 0o755)
		olds = append(olds, p)
	}

	// A runtime execs the plugin all along; no exec may fail (ETXTBSY, a partial
	// file, a missing file after the first restore).
	var execs, failures atomic.Int64
	var firstFailure atomic.Value
	stopExec := make(chan struct{})
	execDone := make(chan struct{})
	var gate sync.WaitGroup
	gate.Add(1)
	go func() {
		defer close(execDone)
		gate.Wait()
		for {
			select {
			case <-stopExec:
				return
			default:
			}
			cmd := exec.Command(plugin)
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			out, err := cmd.Output()
			execs.Add(1)
			if err != nil || !bytes.Contains(out, []byte("cniVersion")) {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, fmt.Sprintf("%v: %s", err, out))
			}
		}
	}()

	// Deleted: restored.
	os.Remove(plugin)
	eventually(t, 5*time.Second, "the deleted plugin is restored", installed)
	gate.Done()
	// Replaced by another build (an older version): replaced back, atomically,
	// while it is being exec'd.
	for _, tmp := range olds {
		if err := os.Rename(tmp, plugin); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "our build is back", installed)
		time.Sleep(20 * time.Millisecond)
	}
	close(stopExec)
	<-execDone
	t.Logf("%d execs of the plugin while it was replaced, %d failed", execs.Load(), failures.Load())
	if failures.Load() > 0 {
		t.Errorf("%d of %d execs failed, first: %v", failures.Load(), execs.Load(), firstFailure.Load())
	}

	// The kubeconfig and the second binary: deleted, restored.
	kc := filepath.Join(n.runDir, "istio-cni-kubeconfig")
	os.Remove(kc)
	os.Remove(filepath.Join(n.binDir, "istio-iptables"))
	eventually(t, 5*time.Second, "kubeconfig and istio-iptables are restored", func() bool {
		_, err1 := os.Stat(kc)
		_, err2 := os.Stat(filepath.Join(n.binDir, "istio-iptables"))
		return err1 == nil && err2 == nil
	})
	// The config deleted by its owner (and written again): our entry comes back.
	os.Remove(filepath.Join(n.confDir, "10-calico.conflist"))
	eventually(t, 5*time.Second, "not ready without a config", func() bool { return !p.ready() })
	writeLikeACNI(t, filepath.Join(n.confDir, "10-calico.conflist"), []byte(calicoConflist))
	eventually(t, 5*time.Second, "the entry is in the new file", func() bool { return hasEntryLast(filepath.Join(n.confDir, "10-calico.conflist")) })
	p.waitReady(t)
}

func TestAgentRewritesTheKubeconfigWhenTheTokenRotates(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t, "KUBECONFIG_MODE=0640")
	p.waitReady(t)
	kcPath := filepath.Join(n.runDir, "istio-cni-kubeconfig")
	for i := 2; i <= 4; i++ {
		token := fmt.Sprintf("token-%d", i)
		start := time.Now()
		n.rotateToken(t, token)
		eventually(t, 5*time.Second, "the kubeconfig holds "+token, func() bool {
			kc, err := kube.LoadKubeconfig(kcPath)
			return err == nil && kc.Token == token
		})
		t.Logf("kubeconfig rewritten %v after the token rotated", time.Since(start))
		if fi, _ := os.Stat(kcPath); fi.Mode().Perm() != 0o640 {
			t.Errorf("kubeconfig mode %v after rotation, want 0640", fi.Mode())
		}
	}
	// The counter moves right after the rename the test just saw.
	eventually(t, 5*time.Second, "istio_cni_kubeconfig_writes_total is 4 (install and three rotations)", func() bool {
		return p.metric(t, "istio_cni_kubeconfig_writes_total") == 4
	})
	// A token that cannot be used is reported, and the last good kubeconfig stays.
	n.rotateToken(t, "")
	p.waitLog(t, "the empty token is reported", `level=ERROR msg="install step failed" error="service account token \S+ is empty"`)
	if kc, err := kube.LoadKubeconfig(kcPath); err != nil || kc.Token != "token-4" {
		t.Errorf("kubeconfig after an empty token: %+v %v, want token-4 kept", kc, err)
	}
}

func TestAgentLeavesBadConfigsUntouchedAndInstallsOnceOneIsValid(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		file    string
		data    string
		wantLog string // regexp over the agent's log
	}{
		{"garbage", "10-calico.conflist", "this is not a CNI config\n", `10-calico.conflist: invalid JSON`},
		{"truncated", "10-calico.conflist", calicoConflist[:len(calicoConflist)/2], `10-calico.conflist: invalid JSON`},
		{"empty", "10-calico.conflist", "", `10-calico.conflist`},
		{"plugins not a list", "10-calico.conflist", `{"name": "x", "cniVersion": "0.3.1", "plugins": {"type": "calico"}}`, `10-calico.conflist: .*plugins`},
		{"conf without a type", "10-flannel.conf", `{"name": "cbr0", "cniVersion": "0.3.1"}`, `10-flannel.conf: .*type`},
		{"a spec version the plugin does not speak", "10-old.conflist", `{"name": "old", "cniVersion": "0.2.0", "plugins": [{"type": "bridge"}]}`,
			`10-old.conflist left untouched: its cniVersion 0.2.0 is one istio-cni does not speak \(0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0\)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			bad := filepath.Join(n.confDir, tc.file)
			writeFile(t, bad, []byte(tc.data), 0o644)
			p := n.startAgent(t)
			line := p.waitLog(t, "the bad file is reported", `level=ERROR .*`+tc.wantLog+`.*`)
			t.Logf("agent says: %s", line)
			time.Sleep(100 * time.Millisecond)
			if p.ready() {
				t.Error("ready without a valid config")
			}
			if got, _ := os.ReadFile(bad); string(got) != tc.data {
				t.Errorf("the bad file changed:\n%s", got)
			}
			if tmp := hiddenTemps(t, n.confDir); len(tmp) > 0 {
				t.Errorf("temporary files left: %v", tmp)
			}
			// The owner writes a valid config: the agent installs into it.
			good := filepath.Join(n.confDir, "10-calico.conflist")
			if tc.file != "10-calico.conflist" {
				os.Remove(bad)
			}
			writeLikeACNI(t, good, []byte(calicoConflist))
			p.waitReady(t)
			if !hasEntryLast(good) {
				t.Errorf("no entry in %s", good)
			}
		})
	}
}

func TestAgentSkipsABadConfigThatSortsFirstAsTheRuntimeDoes(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	garbage := filepath.Join(n.confDir, "05-broken.conf")
	writeFile(t, garbage, []byte(`{"cniVersion": "0.3.1", "type": `), 0o644)
	n.writeCalico(t)
	p := n.startAgent(t)
	p.waitReady(t)
	if !hasEntryLast(filepath.Join(n.confDir, "10-calico.conflist")) {
		t.Error("no entry in the valid config")
	}
	p.waitLog(t, "the skipped file is named", `level=ERROR .*05-broken.conf left untouched`)
	if got, _ := os.ReadFile(garbage); string(got) != `{"cniVersion": "0.3.1", "type": ` {
		t.Errorf("the broken file changed: %s", got)
	}
}

func hiddenTemps(t testing.TB, dir string) []string {
	var out []string
	for name := range snapshot(t, dir) {
		if strings.Contains(name, ".tmp-") {
			out = append(out, name)
		}
	}
	return out
}

func TestTwoAgentsRacingOnOneNodeLeaveExactlyOneEntry(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)
	before := snapshot(t, n.confDir)
	// Ten rewrites within milliseconds of the re-inserts are a primary fighting the
	// entry (TestAgentIsNotReadyWhileThePrimaryKeepsDroppingTheEntry): this test is
	// about the two agents' writes, so the count is raised above them.
	a := n.startAgent(t, "REVERT_WARN_COUNT=20")
	b := n.startAgent(t, "REVERT_WARN_COUNT=20")
	// The primary rewrites its file while both agents insert.
	for range 10 {
		writeLikeACNI(t, path, []byte(calicoConflist))
		time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
	}
	eventually(t, 10*time.Second, "both agents are ready", func() bool { return a.ready() && b.ready() })
	time.Sleep(200 * time.Millisecond) // let any last write settle
	if types := pluginTypes(t, path); countType(types, "istio-cni") != 1 || types[len(types)-1] != "istio-cni" {
		t.Errorf("plugins = %v, want exactly one istio-cni entry, last", types)
	}
	a.stop(t)
	b.stop(t)
	if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
		t.Errorf("conf dir after both agents stopped (-before +after):\n%s", diff)
	}
}

func TestAgentKilledMidWriteAndRestartedNeverExposesAPartialFile(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)

	// A reader in a loop, as the runtime: every config file it can open must be whole.
	var reads, partial atomic.Int64
	var firstPartial atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for ctx.Err() == nil {
			files, _ := libcni.ConfFiles(n.confDir, []string{".conf", ".conflist", ".json"})
			for _, f := range files {
				data, err := os.ReadFile(f)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				reads.Add(1)
				if _, err := typesOf(data, f); err != nil {
					partial.Add(1)
					firstPartial.CompareAndSwap(nil, fmt.Sprintf("%s: %v: %q", filepath.Base(f), err, data))
				}
			}
		}
	}()

	const rounds = 15
	for i := range rounds {
		p := n.startAgent(t)
		// Drop our entry and kill the agent at a random moment of its re-insert.
		writeLikeACNI(t, path, []byte(calicoConflist))
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		p.kill()
		if i == rounds-1 {
			break
		}
	}
	p := n.startAgent(t)
	p.waitReady(t)
	cancel()
	<-readerDone
	t.Logf("%d reads of the config dir during %d kills, %d partial", reads.Load(), rounds, partial.Load())
	if partial.Load() > 0 {
		t.Errorf("a reader saw a partial config: %v", firstPartial.Load())
	}
	if !hasEntryLast(path) {
		t.Errorf("after the restart %s is %v, want one istio-cni entry last", path, pluginTypes(t, path))
	}
	if tmp := hiddenTemps(t, n.confDir); len(tmp) > 0 {
		t.Errorf("a restarted agent left temporary files: %v", tmp)
	}
}

func TestStandaloneModeWritesItsOwnConfigAndThePluginLogsReachTheAgent(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	before := snapshot(t, n.confDir)
	p := n.startAgent(t, "CHAINED_CNI_PLUGIN=false", "EXCLUDE_NAMESPACES=kube-system", "PLUGIN_LOG_LEVEL=debug")
	p.waitReady(t)
	own := filepath.Join(n.confDir, DefaultStandaloneName)
	conf, err := libcni.ConfFromFile(own)
	if err != nil {
		t.Fatalf("the runtime cannot load %s: %v", own, err)
	}
	if conf.Network.Type != "istio-cni" || conf.Network.Name != "istio-cni" || conf.Network.CNIVersion == "" {
		t.Errorf("standalone config: %+v", conf.Network)
	}
	if got, _ := os.ReadFile(filepath.Join(n.confDir, "10-calico.conflist")); string(got) != calicoConflist {
		t.Error("standalone mode touched the primary's config")
	}

	// The runtime runs the installed plugin with the installed config.
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{
		ContainerID: "0123456789abcdef", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "kube-system"}, {"K8S_POD_NAME", "coredns-1"}},
	}
	if _, err := cni.AddNetwork(context.Background(), conf, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	rt.NetNS = ""
	if err := cni.DelNetwork(context.Background(), conf, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	eventually(t, 5*time.Second, "the plugin's records reach the agent's stdout", func() bool {
		out := p.stdout.String()
		return strings.Contains(out, `"msg":"ADD: pod passed through"`) && strings.Contains(out, `"msg":"DEL: no network namespace, nothing to do"`)
	})
	for _, line := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("stdout line is not one JSON record: %q", line)
		}
	}
	t.Logf("agent stdout:\n%s", p.stdout.String())
	if v := p.metric(t, `istio_cni_plugin_events_total{command="ADD",outcome="passed_through"}`); v != 1 {
		t.Errorf("ADD passed_through = %v, want 1", v)
	}
	if v := p.metric(t, `istio_cni_plugin_events_total{command="DEL",outcome="nothing_to_do"}`); v != 1 {
		t.Errorf("DEL nothing_to_do = %v, want 1", v)
	}

	// Deleted: put back. SIGTERM: gone, the dir as before.
	os.Remove(own)
	eventually(t, 5*time.Second, "the standalone config is restored", func() bool { _, err := os.Stat(own); return err == nil })
	p.stop(t)
	if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
		t.Errorf("conf dir after uninstall (-before +after):\n%s", diff)
	}
}

func TestAgentRefusesToStartOnSettingsTheNodeContradicts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"a bad setting", []string{"KUBECONFIG_MODE=999"}, `invalid environment variable KUBECONFIG_MODE: "999" is not an octal file mode`},
		{"no plugin in the image dir", []string{"CNI_BIN_SOURCE_DIR=/"}, "CNI_BIN_SOURCE_DIR / holds no istio-cni binary"},
		{"a template the plugin would refuse", []string{`CNI_NETWORK_CONFIG={"type": "istio-cni", "exclude_namespaces": ["Bad"]}`}, `"exclude_namespaces": "Bad" is not a namespace name`},
		{"a setting the template does not hold", []string{`CNI_NETWORK_CONFIG={"type": "istio-cni", "exclude_namespaces": ["kube-system"]}`, "EXCLUDE_NAMESPACES=istio-system,kube-system"},
			`CNI_NETWORK_CONFIG: environment variable EXCLUDE_NAMESPACES "istio-system,kube-system", but the entry it gives excludes "kube-system" (exclude_namespaces)`},
		{"a missing secondary bin dir", []string{"SECONDARY_BIN_DIR=/nonexistent-bin"}, `SECONDARY_BIN_DIR "/nonexistent-bin" is not a directory`},
		{"repair in place without the node's /proc", []string{"REPAIR_ENABLED=true", "REPAIR_REPAIR_PODS=true", "REPAIR_PROC_DIR=/nonexistent-proc", "NODE_NAME=node-a"},
			`REPAIR_PROC_DIR "/nonexistent-proc" is not a directory, so repair in place (REPAIR_REPAIR_PODS=true) could enter no pod's network namespace`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			// An agent that starts instead is stopped, and fails the case.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, built.agentBin)
			cmd.Env = n.env(tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want 1:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, out)
			}
			if left := snapshot(t, n.binDir); len(left) > 0 {
				t.Errorf("a refused start installed %v", keys(left))
			}
		})
	}
}

// newNetns returns the path of a fresh network namespace, held by a sleeping child
// (creating one needs root: without it this fails, never skips).
func newNetns(t testing.TB) string {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Fatalf("create a network namespace (needs root): %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
}

// TestStandaloneConfigNeverSortsBeforeANetwork: a runtime loads the first config of
// its dir in byte order, so the standalone config's default name sorts after the
// node's network (multus.conf, upper-case names), and a name that would sort before
// another network config is refused, naming both files, with nothing written.
func TestStandaloneConfigNeverSortsBeforeANetwork(t *testing.T) {
	t.Parallel()
	t.Run("the default name sorts after the node's network", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		for _, name := range []string{"multus.conf", "YYY-net.conf", "ovn-k8s.conflist"} {
			writeFile(t, filepath.Join(n.confDir, name), []byte(`{"cniVersion":"1.0.0","name":"`+strings.TrimSuffix(name, filepath.Ext(name))+`","type":"bridge"}`), 0o644)
		}
		p := n.startAgent(t, "CHAINED_CNI_PLUGIN=false")
		p.waitReady(t)
		files, err := libcni.ConfFiles(n.confDir, []string{".conf", ".conflist", ".json"})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(files)
		if last := filepath.Base(files[len(files)-1]); last != DefaultStandaloneName {
			t.Errorf("configs in byte order %v: ours is not last", files)
		}
	})
	t.Run("a name that sorts first is refused", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		writeFile(t, filepath.Join(n.confDir, "multus.conf"), []byte(`{"cniVersion":"1.0.0","name":"multus","type":"bridge"}`), 0o644)
		p := n.startAgent(t, "CHAINED_CNI_PLUGIN=false", "CNI_CONF_NAME=istio-cni.conf")
		p.waitLog(t, "the refusal names both files", `standalone config istio-cni.conf not written: it would sort before multus.conf`)
		if _, err := os.Stat(filepath.Join(n.confDir, "istio-cni.conf")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the refused config was written (stat: %v)", err)
		}
		if p.ready() {
			t.Error("the agent is ready without its config")
		}
	})
	t.Run("a file at our name over a config's size is left as it is", func(t *testing.T) {
		t.Parallel()
		n := newNode(t)
		path := filepath.Join(n.confDir, DefaultStandaloneName)
		big := []byte(`{"cniVersion":"1.0.0","name":"other","type":"bridge","pad":"` + strings.Repeat("x", cniconf.MaxConfigSize) + `"}`)
		writeFile(t, path, big, 0o644)
		p := n.startAgent(t, "CHAINED_CNI_PLUGIN=false")
		p.waitLog(t, "the refusal names the file and the bound", `standalone config .*`+DefaultStandaloneName+` left untouched: .*more than the 1048576 bytes a CNI config may have`)
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, big) {
			t.Errorf("the file was changed (%d bytes, %v)", len(got), err)
		}
		if p.ready() {
			t.Error("the agent is ready without its config")
		}
	})
}

// TestStandaloneConfigHasIstiosFileMode: the standalone config is written with
// Istio's mode for the CNI config files its install-cni writes, 0600, and 0640 with
// CNI_CONF_GROUP_READ=true (the CIS benchmark asks for 0600 or less on the node's
// CNI configs); a file of ours an earlier agent left with another mode gets it too,
// whether its content is rewritten or already right. Before, the file was 0644
// whatever CNI_CONF_GROUP_READ said, and an existing file kept its mode.
func TestStandaloneConfigHasIstiosFileMode(t *testing.T) {
	t.Parallel()
	mode := func(t *testing.T, path string) os.FileMode {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	for _, tc := range []struct {
		name string
		env  []string
		want os.FileMode
	}{
		{"default", nil, 0o600},
		{"CNI_CONF_GROUP_READ=true", []string{"CNI_CONF_GROUP_READ=true"}, 0o640},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			path := filepath.Join(n.confDir, DefaultStandaloneName)
			env := append([]string{"CHAINED_CNI_PLUGIN=false"}, tc.env...)

			// An earlier version's file of ours, another content, 0644: rewritten.
			writeFile(t, path, []byte(`{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni"}`), 0o644)
			p := n.startAgent(t, env...)
			p.waitReady(t)
			if got := mode(t, path); got != tc.want {
				t.Errorf("rewritten standalone config: mode %#o, want %#o", got, tc.want)
			}
			// Killed: the file stays. Its mode changed, its content right: the next
			// agent sets the mode.
			// The kubeconfig, the agent's other file, likewise gets KUBECONFIG_MODE.
			p.kill()
			kubeconfig := filepath.Join(n.runDir, "istio-cni-kubeconfig")
			for _, f := range []string{path, kubeconfig} {
				if err := os.Chmod(f, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			content, _ := os.ReadFile(path)
			p = n.startAgent(t, env...)
			p.waitReady(t)
			eventually(t, 5*time.Second, fmt.Sprintf("the standalone config's mode is %#o", tc.want), func() bool { return mode(t, path) == tc.want })
			eventually(t, 5*time.Second, "the kubeconfig's mode is 0600", func() bool { return mode(t, kubeconfig) == 0o600 })
			if got, _ := os.ReadFile(path); string(got) != string(content) {
				t.Errorf("content changed:\n%s\nwant\n%s", got, content)
			}

			// Deleted: written anew with the mode.
			os.Remove(path)
			eventually(t, 5*time.Second, "the standalone config is back", func() bool { _, err := os.Stat(path); return err == nil })
			if got := mode(t, path); got != tc.want {
				t.Errorf("new standalone config: mode %#o, want %#o", got, tc.want)
			}
		})
	}
}

// TestTwoAgentsThatDisagreeStopRewritingEachOthersFiles runs two agents on one node
// that write different kubeconfigs (their tokens differ) and different entries (their
// plugin log levels differ), as two releases of the chart with different ports
// would. Each rewrites what the other wrote; without a bound they do so as fast as
// the watch reports it. Both must slow to a bounded rate, and say why.
func TestTwoAgentsThatDisagreeStopRewritingEachOthersFiles(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)
	other := *n
	other.saDir = filepath.Join(filepath.Dir(n.saDir), "sa-other")
	if err := os.MkdirAll(other.saDir, 0o755); err != nil {
		t.Fatal(err)
	}
	other.rotateToken(t, "token-of-the-other-release")
	writeFile(t, filepath.Join(other.saDir, "ca.crt"), n.ca, 0o644)

	a := n.startAgent(t, "PLUGIN_LOG_LEVEL=info")
	b := other.startAgent(t, "PLUGIN_LOG_LEVEL=debug")
	eventually(t, 10*time.Second, "both agents are ready", func() bool { return a.ready() && b.ready() })

	// Count the writes as the runtime would see them: each is a rename onto the file.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, d := range []string{n.confDir, n.runDir} {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	writes := map[string]int{}
	// After a first few rewrites each agent backs off, starting at a second and
	// doubling: over 3 s, a handful of writes of each file between the two.
	for end := time.After(3 * time.Second); ; {
		select {
		case ev := <-w.Events:
			if ev.Has(fsnotify.Create) {
				writes[filepath.Base(ev.Name)]++
			}
			continue
		case err := <-w.Errors:
			t.Fatal(err)
		case <-end:
		}
		break
	}
	for _, f := range []string{"10-calico.conflist", plugin.KubeconfigName} {
		if writes[f] > 20 {
			t.Errorf("%s written %d times in 3 s by two agents, want at most 20", f, writes[f])
		}
	}
	if a.metric(t, "istio_cni_contested_writes_deferred_total")+b.metric(t, "istio_cni_contested_writes_deferred_total") == 0 {
		t.Error("istio_cni_contested_writes_deferred_total is 0 on both agents")
	}
	for _, p := range []*agentProc{a, b} {
		p.waitLog(t, "the agent names the fight", `another writer keeps changing [^"]*istio-cni-kubeconfig`)
		p.waitLog(t, "the agent names the fight over the entry", `another writer keeps changing [^"]*10-calico.conflist`)
	}
	if types := pluginTypes(t, path); countType(types, "istio-cni") != 1 || types[len(types)-1] != "istio-cni" {
		t.Errorf("plugins = %v, want exactly one istio-cni entry, last", types)
	}
	a.stop(t)
	b.stop(t)
}

// TestAPutBackAfterARestartIsCountedAsAReinsert: an agent that starts where an
// earlier agent left the entry in place (UNINSTALL_ON_EXIT=never, a rolling update)
// puts it back, when something removes it, as a re-insert: counted in
// istio_cni_config_reinserts_total and logged, as every later put-back is.
func TestAPutBackAfterARestartIsCountedAsAReinsert(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		remove  func(t *testing.T, n *node, calico string)
		present func(n *node, calico string) bool
	}{
		{
			name: "chained",
			remove: func(t *testing.T, n *node, calico string) {
				writeLikeACNI(t, calico, []byte(calicoConflist))
			},
			present: func(n *node, calico string) bool { return hasEntryLast(calico) },
		},
		{
			name: "standalone",
			env:  []string{"CHAINED_CNI_PLUGIN=false"},
			remove: func(t *testing.T, n *node, calico string) {
				if err := os.Remove(filepath.Join(n.confDir, DefaultStandaloneName)); err != nil {
					t.Fatal(err)
				}
			},
			present: func(n *node, calico string) bool {
				_, err := os.Stat(filepath.Join(n.confDir, DefaultStandaloneName))
				return err == nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			calico := n.writeCalico(t)
			env := append([]string{"UNINSTALL_ON_EXIT=never"}, tc.env...)
			first := n.startAgent(t, env...)
			first.waitReady(t)
			first.stop(t)
			if !tc.present(n, calico) {
				t.Fatal("the first agent took its entry out on exit")
			}

			p := n.startAgent(t, env...)
			p.waitReady(t)
			tc.remove(t, n, calico)
			eventually(t, 5*time.Second, "the entry is back", func() bool { return tc.present(n, calico) })
			eventually(t, 5*time.Second, "the put-back is counted", func() bool {
				return p.metric(t, `istio_cni_installs_total{result="SUCCESS"}`) == 1
			})
			if got := p.metric(t, "istio_cni_config_reinserts_total"); got != 1 {
				t.Errorf("istio_cni_config_reinserts_total = %v after the entry was put back once, want 1", got)
			}
			// The agent's stderr reaches the test through a pipe: the line may come a
			// moment after the metric.
			eventually(t, 5*time.Second, `the put-back is logged ("put the istio-cni entry back into the CNI config")`, func() bool {
				return strings.Contains(p.stderr.String(), "put the istio-cni entry back into the CNI config")
			})
		})
	}
}

// TestAnAgentThatFindsItsEntryInPlaceSaysTheConfigHoldsIt: "the CNI config holds
// the istio-cni entry" is what the README's check greps the agent's log for. An
// agent that starts where an earlier one left the entry (UNINSTALL_ON_EXIT=never
// or auto: a rolling update, a crash) finds it in place and writes nothing; it
// logs the line all the same, once.
func TestAnAgentThatFindsItsEntryInPlaceSaysTheConfigHoldsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"chained", nil},
		{"standalone", []string{"CHAINED_CNI_PLUGIN=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.writeCalico(t)
			env := append([]string{"UNINSTALL_ON_EXIT=never"}, tc.env...)
			first := n.startAgent(t, env...)
			first.waitReady(t)
			first.stop(t)

			p := n.startAgent(t, env...)
			p.waitReady(t)
			const line = "the CNI config holds the istio-cni entry"
			eventually(t, 5*time.Second, "the line is logged", func() bool { return strings.Contains(p.stderr.String(), line) })
			if got := strings.Count(p.stderr.String(), line); got != 1 {
				t.Errorf("%d lines say the CNI config holds the istio-cni entry, want 1:\n%s", got, p.stderr.String())
			}
		})
	}
}

// TestARestartedAgentTakesItsEntryOutOfTheFileThatWasThePrimary: an agent whose
// primary config moves (a config that sorts first appears) takes its entry out of
// the old file (moveFrom). One killed in between (after the write into the new
// primary, before the take-out), or while the primary moved, left the entry and its
// backup in the old file, and the next agent, knowing only the file it found
// first, never took them out: its uninstall then left the conf dir with an
// istio-cni entry whose binary it removed, which the runtime loads as soon as the
// new primary goes away.
func TestARestartedAgentTakesItsEntryOutOfTheFileThatWasThePrimary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// move leaves the conf dir as the killed agent did, once 10-calico.conflist
		// held its entry.
		move func(t *testing.T, n *node)
	}{
		{"a config sorting first appeared while no agent ran", func(t *testing.T, n *node) {
			writeFile(t, filepath.Join(n.confDir, "05-other.conflist"), []byte(calicoConflist), 0o644)
		}},
		{"killed between the write into the new primary and the take-out", func(t *testing.T, n *node) {
			installed, err := os.ReadFile(filepath.Join(n.confDir, "10-calico.conflist"))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, cniconf.BackupPath(n.confDir, "05-other.conflist"), []byte(calicoConflist), 0o600)
			writeFile(t, filepath.Join(n.confDir, "05-other.conflist"), installed, 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.writeCalico(t)
			first := n.startAgent(t, "UNINSTALL_ON_EXIT=never")
			first.waitReady(t)
			first.kill()
			tc.move(t, n)
			before := map[string]fileState{
				"05-other.conflist":  {0o644, calicoConflist},
				"10-calico.conflist": {0o644, calicoConflist},
			}

			p := n.startAgent(t)
			p.waitReady(t)
			if !hasEntryLast(filepath.Join(n.confDir, "05-other.conflist")) {
				t.Errorf("05-other.conflist, the primary now, does not end with the entry: %v", pluginTypes(t, filepath.Join(n.confDir, "05-other.conflist")))
			}
			if got := pluginTypes(t, filepath.Join(n.confDir, "10-calico.conflist")); countType(got, cniconf.PluginType) != 0 {
				t.Errorf("10-calico.conflist, the primary no more, still holds the killed agent's entry: %v", got)
			}
			p.stop(t)
			if diff := cmp.Diff(before, snapshot(t, n.confDir)); diff != "" {
				t.Errorf("conf dir after uninstall differs from before the install (-before +after):\n%s", diff)
			}
		})
	}
}

// TestReadyzSaysWhatKeepsTheAgentNotReady: a not-ready agent's /readyz names what
// is missing and the error of the step that failed (the kubelet's probe looks at
// the status only; the body is for whoever asks the probe port). Before, it
// answered one sentence listing every possible cause, whatever kept the agent not
// ready.
func TestReadyzSaysWhatKeepsTheAgentNotReady(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	p := n.startAgent(t)
	// No primary config yet: waiting for it, and saying so.
	eventually(t, 10*time.Second, "/readyz names the missing entry and the wait for the primary's config", func() bool {
		code, body := p.readyz()
		return code == http.StatusServiceUnavailable &&
			strings.Contains(body, "the CNI config in "+n.confDir+" does not hold the istio-cni entry") &&
			strings.Contains(body, "no primary CNI config in "+n.confDir) && !strings.Contains(body, "binary") && !strings.Contains(body, "kubeconfig")
	})
	n.writeCalico(t)
	p.waitReady(t)
	if code, body := p.readyz(); code != http.StatusOK || body != "ready\n" {
		t.Errorf("ready agent: /readyz %d %q, want 200 %q", code, body, "ready\n")
	}
	if !strings.Contains(p.stderr.String(), `"readiness changed"`) && !strings.Contains(p.stderr.String(), "readiness changed") {
		t.Errorf("no readiness change logged:\n%s", p.stderr.String())
	}
}

// TestADELOfAPodSetUpBeforeTheUninstallSucceeds: after the agent's uninstall the
// runtime still tears down the pods the plugin set up, through the chain they were
// set up with (CRI-O keeps it; containerd until it reloads the config). libcni runs
// a DEL from the chain's last plugin back and fails it at the first binary it cannot
// find, before the primary's DEL: before, the uninstall removed the plugin's binary,
// so every such pod stayed Terminating with "failed to find plugin istio-cni in
// path" and its address was never released. The plugin's binary stays, and its DEL
// needs nothing else the uninstall removed (kubeconfig, agent, run dir).
func TestADELOfAPodSetUpBeforeTheUninstallSucceeds(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	path := n.writeCalico(t)
	p := n.startAgent(t)
	p.waitReady(t)
	installed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p.stop(t) // uninstalls: no API server tells it to stay

	// The chain as the runtime cached it for a pod set up meanwhile, our entry
	// alone: the primary's binary is not on this test node.
	list, err := libcni.ConfListFromBytes(installed)
	if err != nil {
		t.Fatal(err)
	}
	list.Plugins = slices.DeleteFunc(list.Plugins, func(c *libcni.PluginConfig) bool { return c.Network.Type != cniconf.PluginType })
	if len(list.Plugins) != 1 {
		t.Fatalf("the installed chain holds %d istio-cni entries, want 1:\n%s", len(list.Plugins), installed)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{ContainerID: "0123456789ab", IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_INFRA_CONTAINER_ID", "0123456789ab"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		t.Errorf("DEL through the chain the pod was set up with, after the uninstall: %v", err)
	}
}
