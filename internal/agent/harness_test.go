package agent

// The harness runs the real install-cni binary against a throwaway "node": temporary
// CNI config and bin dirs, a run dir, and a ServiceAccount dir.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/poll"
	"github.com/istio-cni/istio-cni/test/harness/repo"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// built holds install-cni and the binaries it installs (istio-cni, istio-iptables),
// built once per test binary.
var built struct {
	dir      string // install-cni lives here
	source   string // CNI_BIN_SOURCE_DIR: istio-cni and istio-iptables
	agentBin string
}

func TestMain(m *testing.M) {
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "install-cni-test")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	built.dir, built.source = dir, filepath.Join(dir, "image-bin")
	built.agentBin = filepath.Join(dir, "install-cni")
	if err := os.MkdirAll(built.source, 0o755); err != nil {
		return 0, err
	}
	root, err := repo.Root()
	if err != nil {
		return 0, err
	}
	for _, b := range []struct{ out, pkg string }{
		{built.agentBin, "./cmd/install-cni"},
		{filepath.Join(built.source, "istio-cni"), "./cmd/istio-cni"},
		{filepath.Join(built.source, "istio-iptables"), "./cmd/istio-iptables"},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build %s: %w: %s", b.pkg, err, out)
		}
	}
	return m.Run(), nil
}

// node is a throwaway node's directories.
type node struct {
	confDir, binDir, runDir, saDir string
	ca                             []byte
}

// writeCalico writes Calico's config as the primary CNI's, 10-calico.conflist,
// and returns its path.
func (n *node) writeCalico(t testing.TB) string {
	t.Helper()
	path := filepath.Join(n.confDir, "10-calico.conflist")
	writeFile(t, path, []byte(calicoConflist), 0o644)
	return path
}

func newNode(t testing.TB) *node {
	t.Helper()
	root := shortdir.New(t) // the agent's sockets go in it
	n := &node{
		confDir: filepath.Join(root, "etc/cni/net.d"),
		binDir:  filepath.Join(root, "opt/cni/bin"),
		runDir:  filepath.Join(root, "run/istio-cni"),
		saDir:   filepath.Join(root, "sa"),
		ca:      testCA(t),
	}
	for _, d := range []string{n.confDir, n.binDir, n.saDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.rotateToken(t, "token-1")
	writeFile(t, filepath.Join(n.saDir, "ca.crt"), n.ca, 0o644)
	return n
}

// rotateToken replaces the token as the kubelet does for a projected volume: the
// files are symlinks into a ..data symlink that is swapped atomically.
func (n *node) rotateToken(t testing.TB, token string) {
	t.Helper()
	ts := filepath.Join(n.saDir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ts, "token"), []byte(token), 0o644)
	tmp := filepath.Join(n.saDir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.saDir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(n.saDir, "token")); err != nil {
		if err := os.Symlink("..data/token", filepath.Join(n.saDir, "token")); err != nil {
			t.Fatal(err)
		}
	}
}

func (n *node) env(extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"MOUNTED_CNI_NET_DIR=" + n.confDir,
		"MOUNTED_CNI_BIN_DIR=" + n.binDir,
		"CNI_BIN_SOURCE_DIR=" + built.source,
		"CNI_AGENT_RUN_DIR=" + n.runDir,
		"SERVICE_ACCOUNT_DIR=" + n.saDir,
		"KUBERNETES_SERVICE_HOST=127.0.0.1",
		"KUBERNETES_SERVICE_PORT=6443",
		"MONITORING_PORT=0",
		"READINESS_PORT=0",
		// No API server here: what would watch it is off unless a test turns it on
		// (a later entry in extra wins).
		"POD_CACHE_ENABLED=false",
		"REPAIR_ENABLED=false",
		// No DaemonSet to ask: the tests of a restart set auto or never.
		"UNINSTALL_ON_EXIT=always",
	}, extra...)
}

// agentProc is a running install-cni.
type agentProc struct {
	cmd            *exec.Cmd
	stdout, stderr *logbuf.Buffer
	metrics, probe string // http://addr
	exited         chan struct{}
	exitErr        error
}

// startAgent runs install-cni with the node's environment plus extra, and waits
// for its HTTP servers.
func (n *node) startAgent(t testing.TB, extra ...string) *agentProc {
	t.Helper()
	return n.startAgentVia(t, nil, extra...)
}

// startAgentVia is startAgent with install-cni run by the command wrapper (its
// argv, install-cni's path appended): setpriv, to run it with a pod's
// capabilities.
func (n *node) startAgentVia(t testing.TB, wrapper []string, extra ...string) *agentProc {
	t.Helper()
	p := &agentProc{stdout: &logbuf.Buffer{}, stderr: &logbuf.Buffer{}, exited: make(chan struct{})}
	argv := append(append([]string{}, wrapper...), built.agentBin)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = n.env(extra...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		// An agent built with -race (GOFLAGS=-race: TestMain's go build inherits it)
		// prints a race on stderr; one killed rather than stopped never exits 66 to say so.
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("agent %d: data race", p.cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("agent %d stderr:\n%s", p.cmd.Process.Pid, p.stderr.String())
		}
	})
	addrRE := regexp.MustCompile(`serves=(\w+) addr=\S*:(\d+)`)
	deadline := time.Now().Add(20 * time.Second)
	for p.metrics == "" || p.probe == "" {
		for _, m := range addrRE.FindAllStringSubmatch(p.stderr.String(), -1) {
			if m[1] == "metrics" {
				p.metrics = "http://127.0.0.1:" + m[2]
			} else {
				p.probe = "http://127.0.0.1:" + m[2]
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("install-cni exited early (%v):\n%s", p.exitErr, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("install-cni did not start its HTTP servers:\n%s", p.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return p
}

// readyz is the agent's /readyz answer: its status code and body ("" and 0 when
// it cannot be asked).
func (p *agentProc) readyz() (int, string) {
	resp, err := http.Get(p.probe + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// contestUntilDeferred replaces path with content (by rename, as another installer
// writes) until the agent defers its overwrites of it (its next one a second or more
// away), then once more, so that the other writer's content stays in place.
func (p *agentProc) contestUntilDeferred(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	put := func() {
		tmp := filepath.Join(filepath.Dir(path), ".other.tmp")
		writeFile(t, tmp, []byte(content), mode)
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.metric(t, "istio_cni_contested_writes_deferred_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the agent never deferred an overwrite of the other writer's %s", filepath.Base(path))
		}
		put()
		time.Sleep(50 * time.Millisecond)
	}
	put()
}

func (p *agentProc) ready() bool {
	resp, err := http.Get(p.probe + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (p *agentProc) waitReady(t testing.TB) {
	t.Helper()
	eventually(t, 20*time.Second, "the agent is ready", p.ready)
}

// stop sends SIGTERM and waits for the exit; the agent must exit 0.
func (p *agentProc) stop(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("install-cni did not exit on SIGTERM:\n%s", p.stderr.String())
	}
	if p.exitErr != nil {
		t.Fatalf("install-cni exited with %v:\n%s", p.exitErr, p.stderr.String())
	}
}

func (p *agentProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

func (p *agentProc) metric(t testing.TB, series string) float64 {
	t.Helper()
	resp, err := http.Get(p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

func (p *agentProc) waitLog(t testing.TB, what string, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var line string
	eventually(t, 20*time.Second, what, func() bool {
		line = rx.FindString(p.stderr.String())
		return line != ""
	})
	return line
}

// eventually polls cond (the test's polling; the agent itself never polls).
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, 2*time.Millisecond, what, cond)
}

func writeFile(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// writeLikeACNI replaces a config the way CNI daemons do (temp file + rename).
func writeLikeACNI(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".cni-daemon-tmp")
	writeFile(t, tmp, data, 0o644)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// snapshot is every file of a directory (hidden ones included) with its mode.
type fileState struct {
	Mode os.FileMode
	Data string
}

func snapshot(t testing.TB, dir string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fileState{fi.Mode(), string(data)}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pluginTypes lists the "type" of every plugin of a config file, in order.
func pluginTypes(t testing.TB, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	types, err := typesOf(data, path)
	if err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	return types
}

func typesOf(data []byte, path string) ([]string, error) {
	var c struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	if filepath.Ext(path) != ".conflist" {
		return []string{c.Type}, nil
	}
	var out []string
	for _, p := range c.Plugins {
		out = append(out, p.Type)
	}
	return out, nil
}

func countType(types []string, typ string) int {
	n := 0
	for _, t := range types {
		if t == typ {
			n++
		}
	}
	return n
}

// hasEntryLast reports whether path is a valid config ending with exactly one
// istio-cni entry.
func hasEntryLast(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	types, err := typesOf(data, path)
	return err == nil && len(types) > 1 && types[len(types)-1] == cniconf.PluginType && countType(types, cniconf.PluginType) == 1
}

// Primary configs in the formats the projects document.
const calicoConflist = `{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "datastore_type": "kubernetes",
      "nodename": "node-1",
      "mtu": 1440,
      "ipam": {"type": "calico-ipam"},
      "policy": {"type": "k8s"},
      "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}
`

const flannelConf = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "type": "flannel",
  "delegate": {
    "hairpinMode": true,
    "isDefaultGateway": true
  }
}
`

func readAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
