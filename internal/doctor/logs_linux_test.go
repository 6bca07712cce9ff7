package doctor

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// TestLogsShowTheRealPluginsDecisions runs the plugin's own ADD and DEL in-process
// (a real pod lookup against the API server, real rules in a real namespace) and
// reads back what it logged with `logs`: the record format is the plugin's, not a
// copy of it. `inspect` then finds the pod captured.
func TestLogsShowTheRealPluginsDecisions(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	runDir := t.TempDir()
	kc, err := os.ReadFile(cp.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runDir, plugin.KubeconfigName), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := `{"cniVersion":"1.0.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":"` + runDir +
		`","iptables_mode":"nft","exclude_namespaces":["kube-system"],"log_socket":"","pod_lookup":{"retries":1}}`
	ip := netip.MustParseAddr("10.251.10.1")
	_, ns := runPod(t, cp, injectedPod("web"), ip)

	p := &plugin.Plugin{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Timeout: time.Minute}
	cmd := func(f func(*cnicmd.CmdArgs) error, id, pod string) error {
		nsName, name, _ := strings.Cut(pod, "/")
		return f(&cnicmd.CmdArgs{ContainerID: id, Netns: ns.path, IfName: "eth0",
			Args: "K8S_POD_NAMESPACE=" + nsName + ";K8S_POD_NAME=" + name, StdinData: []byte(conf)})
	}
	if err := cmd(p.Add, "c0ffee000001aaaa", "app/web"); err != nil {
		t.Fatalf("ADD app/web: %v", err)
	}
	if err := cmd(p.Add, "c0ffee000002bbbb", "kube-system/dns"); err != nil {
		t.Fatalf("ADD kube-system/dns: %v", err)
	}
	if err := cmd(p.Add, "c0ffee000003cccc", "app/nosuch"); err == nil {
		t.Fatal("ADD of a pod that does not exist succeeded")
	}

	e := &nodeEnv{cp: cp, confDir: t.TempDir(), dirs: map[string]string{}}
	if err := os.WriteFile(filepath.Join(e.confDir, "10-k8s.conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"ptp"},`+conf+`]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := e.run("inspect", "app/web"); code != 0 {
		t.Errorf("inspect after the plugin's ADD: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := cmd(p.Del, "c0ffee000001aaaa", "app/web"); err != nil {
		t.Fatalf("DEL app/web: %v", err)
	}

	logFile := filepath.Join(runDir, plugin.LogFileName)
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"logs", "--log-file", logFile}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("logs: exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"ADD   INFO  app/web  redirected to the sidecar (iptables-nft), took ",
		"ADD   INFO  kube-system/dns  NOT redirected: rule namespace-excluded: ",
		"ADD   ERROR app/nosuch  ADD failed: ",
		"DEL   INFO  app/web  DEL: done, took ",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, stdout.String())
		}
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.Contains(line, "DEL   INFO  app/web") && !strings.HasSuffix(line, "[container c0ffee000001]") {
			t.Errorf("the DEL's line does not end with its container: %q", line)
		}
	}
	stdout.Reset()
	if code := Main([]string{"logs", "--config", filepath.Join(e.confDir, "10-k8s.conflist"), "--pod", "app/web"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("logs --config: exit %d: %s", code, stderr.String())
	}
	if n := strings.Count(stdout.String(), "\n"); n != 2 || strings.Contains(stdout.String(), "dns") {
		t.Errorf("logs --pod app/web (log file from the config): want its ADD and DEL only:\n%s", stdout.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr: %s", stderr.String())
	}
}
