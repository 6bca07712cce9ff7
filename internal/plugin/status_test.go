package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/livetemp"
)

// TestStatusReadsTheKubeconfigAsTheLookupDoes: with the legacy
// kubernetes.k8s_api_root, STATUS judges the kubeconfig with that server, as the
// lookup uses it: a server the lookup never dials does not make the node NotReady.
func TestStatusReadsTheKubeconfigAsTheLookupDoes(t *testing.T) {
	dir := t.TempDir()
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: kubernetes.default.svc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
	if err := os.WriteFile(filepath.Join(dir, KubeconfigName), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		root string
		ok   bool
	}{
		{`,"kubernetes":{"k8s_api_root":"https://10.96.0.1:443"}`, true},
		{"", false}, // the kubeconfig's own server is no URL: every lookup would fail
	} {
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q,"log_socket":"","log_file":""%s}`, dir, tc.root)
		var out, stderr bytes.Buffer
		p := &Plugin{Stdout: &out, Stderr: &stderr, Timeout: 5 * time.Second}
		if err := p.Status(&cnicmd.CmdArgs{StdinData: []byte(conf)}); (err == nil) != tc.ok {
			t.Errorf("config %s: STATUS %v, want ready %v", conf, err, tc.ok)
		}
	}
}

// TestAnAPIRootCannotTakeTLSAwayFromTheKubeconfig: an http kubernetes.k8s_api_root
// for a kubeconfig whose server is https would send its token in clear text and
// take pod specs unverified; it is refused naming the field and both URLs, by
// STATUS (so the node shows it at install time) as by the lookup.
func TestAnAPIRootCannotTakeTLSAwayFromTheKubeconfig(t *testing.T) {
	for _, tc := range []struct {
		server, root string
		wantErr      string
	}{
		{"https://10.96.0.1:443", "http://10.96.0.1:80", `kubernetes.k8s_api_root "http://10.96.0.1:80": the kubeconfig's server "https://10.96.0.1:443" is https`},
		{"HTTPS://10.96.0.1:443", "http://u:secret@10.96.0.1:80", `kubernetes.k8s_api_root "http://u:xxxxx@10.96.0.1:80"`},
		{"https://10.96.0.1:443", "HTTPS://api.example:6443", ""},
		{"http://127.0.0.1:8001", "http://127.0.0.1:8002", ""}, // kubectl proxy: no TLS to lose
	} {
		dir := t.TempDir()
		kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n", tc.server)
		if err := os.WriteFile(filepath.Join(dir, KubeconfigName), []byte(kc), 0o600); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q,"log_socket":"","log_file":"","kubernetes":{"k8s_api_root":%q}}`, dir, tc.root)
		var out, stderr bytes.Buffer
		p := &Plugin{Stdout: &out, Stderr: &stderr, Timeout: 5 * time.Second}
		err := p.Status(&cnicmd.CmdArgs{StdinData: []byte(conf)})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("server %s, root %s: STATUS %v, want ready", tc.server, tc.root, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("server %s, root %s: STATUS %v, want an error containing %s", tc.server, tc.root, err, tc.wantErr)
		case tc.wantErr != "" && strings.Contains(err.Error(), "secret"):
			t.Errorf("server %s, root %s: the error quotes the password: %v", tc.server, tc.root, err)
		}
	}
}

// TestGCKeepsAHeldLockFile: GC removes an xtables lock file older than an hour
// only when no process holds its lock (opening and locking it change none of its
// times).
func TestGCKeepsAHeldLockFile(t *testing.T) {
	dir := t.TempDir()
	x := filepath.Join(dir, "xtables")
	if err := os.MkdirAll(x, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	lock := func(name string) string {
		p := filepath.Join(x, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		return p
	}
	held, free := lock("xtables-4026532999.lock"), lock("xtables-4026533000.lock")
	f, err := os.OpenFile(held, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q,"log_socket":"","log_file":""}`, dir)
	var out, stderr bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &stderr, Timeout: 5 * time.Second}
	if err := p.GC(&cnicmd.CmdArgs{StdinData: []byte(conf)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(held); err != nil {
		t.Errorf("GC removed a lock file held now: %v", err)
	}
	if _, err := os.Stat(free); err == nil {
		t.Errorf("GC kept an old lock file nobody holds")
	}
}

// TestGCRemovesAKilledWritersVersionTemporary: a plugin killed between writing the
// node's iptables-nft version to its temporary file and the rename left that file
// for good (nothing else removes it). GC removes such a temporary once no live
// writer holds it, and keeps one that a writer is still filling.
func TestGCRemovesAKilledWritersVersionTemporary(t *testing.T) {
	dir := t.TempDir()
	x := filepath.Join(dir, "xtables")
	if err := os.MkdirAll(x, 0o755); err != nil {
		t.Fatal(err)
	}
	abandoned := filepath.Join(x, iptables.VersionTempPrefix+"123")
	if err := os.WriteFile(abandoned, []byte("/usr/sbin/iptables-nft-restore 1 2 v1.8"), 0o600); err != nil {
		t.Fatal(err)
	}
	live, release, err := livetemp.CreateTemp(x, iptables.VersionTempPrefix+"*")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	live.Close()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q,"log_socket":"","log_file":""}`, dir)
	var out, stderr bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &stderr, Timeout: 5 * time.Second}
	if err := p.GC(&cnicmd.CmdArgs{StdinData: []byte(conf)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abandoned); err == nil {
		t.Errorf("GC kept a version temporary no writer holds")
	}
	if _, err := os.Stat(live.Name()); err != nil {
		t.Errorf("GC removed a version temporary a live writer holds: %v", err)
	}
}

// TestARefusedADDIsToldWithItsReason: an ADD the dispatch refuses before Add runs
// leaves an "ADD failed" record with its reason: config for the config's version
// or shape, environment for CNI_NETNS the plugin's own namespace. Other commands
// are left to the runtime's error.
func TestARefusedADDIsToldWithItsReason(t *testing.T) {
	dir := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"0.2.0","name":"n","type":"istio-cni","cni_agent_run_dir":%q,"log_socket":"","log_file":""}`, dir)
	for _, tc := range []struct {
		name, cmd string
		err       *types.Error
		want      string
	}{
		{"version", "ADD", types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", "config is \"0.2.0\""), "reason=config"},
		{"own namespace", "ADD", types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS /proc/self/ns/net: plugin's netns and netns from CNI_NETNS should not be the same", ""), "reason=environment"},
		{"not an ADD", "CHECK", types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", ""), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			p := &Plugin{Stdout: io.Discard, Stderr: &stderr, Timeout: 5 * time.Second}
			p.refused(tc.cmd, &cnicmd.CmdArgs{ContainerID: "0123456789abcdef", StdinData: []byte(conf)}, tc.err)
			got := stderr.String()
			switch {
			case tc.want == "" && got != "":
				t.Errorf("a refused %s logged:\n%s", tc.cmd, got)
			case tc.want != "" && (!strings.Contains(got, "ADD failed") || !strings.Contains(got, tc.want) || !strings.Contains(got, tc.err.Msg)):
				t.Errorf("the record lacks ADD failed, %s or the error:\n%s", tc.want, got)
			}
		})
	}
}

// TestStatusLogsAChangeOnceNotEveryCall: the runtime runs STATUS every few seconds
// (the kubelet's runtime status every 5 s), and a node whose agent is down logged
// "not ready" at each: thousands of lines a day in the runtime's journal and the
// plugin's log file. Each change of state is logged once, with its reason: not
// ready, not ready for another reason, ready again; each failure is still the
// spec's STATUS error 50, naming the cause.
func TestStatusLogsAChangeOnceNotEveryCall(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, KubeconfigName)
	logFile := filepath.Join(dir, "plugin.log")
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","native_nftables":true,"cni_agent_run_dir":%q,"log_socket":"","log_file":%q}`, dir, logFile))
	valid := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.96.0.1:443\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
	var stderr bytes.Buffer
	p := &Plugin{Stdout: io.Discard, Stderr: &stderr, Timeout: 5 * time.Second}
	status := func() error { return p.Status(&cnicmd.CmdArgs{StdinData: conf}) }
	for _, step := range []struct {
		name      string
		change    func() error
		wantCause string // "" for ready
		wantLog   string // the one record the five runs leave at info level and above, "" for none
	}{
		{"ready from the start", func() error { return os.WriteFile(kubeconfig, []byte(valid), 0o600) }, "", ""},
		{"the agent down, its kubeconfig gone", func() error { return os.Remove(kubeconfig) }, "no such file", "STATUS: not ready"},
		{"another cause", func() error { return os.WriteFile(kubeconfig, []byte("current-context: nowhere\n"), 0o600) }, "nowhere", "STATUS: not ready"},
		{"the agent back", func() error { return os.WriteFile(kubeconfig, []byte(valid), 0o600) }, "", "STATUS: ready again"},
		{"down again", func() error { return os.Remove(kubeconfig) }, "no such file", "STATUS: not ready"},
	} {
		if err := step.change(); err != nil {
			t.Fatal(err)
		}
		stderr.Reset()
		before, _ := os.ReadFile(logFile)
		for range 5 {
			err := status()
			var cerr *types.Error
			switch {
			case step.wantCause == "" && err != nil:
				t.Errorf("%s: STATUS %v, want ready", step.name, err)
			case step.wantCause != "" && (!errors.As(err, &cerr) || cerr.Code != types.ErrPluginNotAvailable || !strings.Contains(cerr.Msg, step.wantCause)):
				t.Errorf("%s: STATUS %v, want error 50 (plugin not available) naming %q", step.name, err, step.wantCause)
			}
		}
		after, _ := os.ReadFile(logFile)
		for out, got := range map[string]string{"stderr": stderr.String(), "the log file": strings.TrimPrefix(string(after), string(before))} {
			lines := strings.Split(strings.TrimSpace(got), "\n")
			if got == "" {
				lines = nil
			}
			switch {
			case step.wantLog == "" && len(lines) != 0:
				t.Errorf("%s: five STATUS runs logged to %s:\n%s\nwant nothing at info level", step.name, out, got)
			case step.wantLog != "" && (len(lines) != 1 || !strings.Contains(got, step.wantLog) || step.wantCause != "" && !strings.Contains(got, step.wantCause)):
				t.Errorf("%s: five STATUS runs logged to %s:\n%s\nwant one record %q naming %q", step.name, out, got, step.wantLog, step.wantCause)
			}
		}
	}
	// Ready again: nothing of the state is left in the run dir.
	if err := os.WriteFile(kubeconfig, []byte(valid), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := status(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, NotReadyStateName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ready again, the run dir still holds %s (stat: %v)", NotReadyStateName, err)
	}
}

// TestStatusOfAnInvalidConfigIsPluginNotAvailable: a config STATUS cannot read is
// the spec's STATUS error 50 (the plugin cannot serve ADDs), not the ADD's 7,
// naming the key; it too is logged once, in the run dir the config names.
func TestStatusOfAnInvalidConfigIsPluginNotAvailable(t *testing.T) {
	dir := t.TempDir()
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"istio-cni","cni_agent_run_dir":%q,"log_socket":"","ambient_enabled":true}`, dir))
	var stderr bytes.Buffer
	p := &Plugin{Stdout: io.Discard, Stderr: &stderr, Timeout: 5 * time.Second}
	for range 3 {
		err := p.Status(&cnicmd.CmdArgs{StdinData: conf})
		var cerr *types.Error
		if !errors.As(err, &cerr) || cerr.Code != types.ErrPluginNotAvailable || !strings.Contains(cerr.Msg, `"ambient_enabled"`) {
			t.Errorf("STATUS = %v, want error 50 naming ambient_enabled", err)
		}
	}
	if got := strings.Count(stderr.String(), "STATUS: not ready"); got != 1 {
		t.Errorf("three STATUS runs logged %d not-ready records, want 1:\n%s", got, stderr.String())
	}
}
