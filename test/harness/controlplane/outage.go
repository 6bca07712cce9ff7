package controlplane

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

// The methods below make the API server fail as a node's agent would see it fail,
// for the tests of what the agent does meanwhile. etcd runs on throughout: the
// cluster's state stays, as it does when a real apiserver restarts.

// PauseAPIServer stops the kube-apiserver process with SIGSTOP: a hung apiserver.
// The kernel still accepts connections on its port and takes what clients send, and
// nothing is answered, on new connections or on those already open (watches
// included), until ResumeAPIServer.
func (c *ControlPlane) PauseAPIServer() error { return c.signalAPIServer(syscall.SIGSTOP) }

// ResumeAPIServer continues a paused apiserver (SIGCONT).
func (c *ControlPlane) ResumeAPIServer() error { return c.signalAPIServer(syscall.SIGCONT) }

func (c *ControlPlane) signalAPIServer(sig syscall.Signal) error {
	c.apiMu.Lock()
	defer c.apiMu.Unlock()
	if !c.apiserver.Running() {
		return fmt.Errorf("kube-apiserver is not running (StopAPIServer): cannot send it %v", sig)
	}
	if err := syscall.Kill(c.apiserver.Pid(), sig); err != nil {
		return fmt.Errorf("send kube-apiserver (pid %d) %v: %w", c.apiserver.Pid(), sig, err)
	}
	return nil
}

// StopAPIServer stops the apiserver (SIGTERM, SIGKILL after 10 s): its port
// refuses connections, and those open are closed, until StartAPIServer.
func (c *ControlPlane) StopAPIServer() error {
	c.apiMu.Lock()
	defer c.apiMu.Unlock()
	_ = syscall.Kill(c.apiserver.Pid(), syscall.SIGCONT) // a paused one would not act on SIGTERM
	return c.apiserver.Stop(10 * time.Second)
}

// StartAPIServer starts a stopped apiserver again, with the same flags, port,
// certificates and etcd, and returns once its /readyz is ok (bounded by ctx). Like
// a real restart it begins with an empty watch cache: a watch resumed from a
// resource version of before is answered 410 Gone (too old resource version)
// unless its cache holds that version, and its client lists again.
func (c *ControlPlane) StartAPIServer(ctx context.Context) error {
	c.apiMu.Lock()
	defer c.apiMu.Unlock()
	if c.apiserver.Running() {
		return fmt.Errorf("kube-apiserver (pid %d) is running: StopAPIServer first", c.apiserver.Pid())
	}
	p, err := c.launcher.Start("kube-apiserver", c.apiBin, c.apiArgs, nil, c.apiserver.LogPath)
	if err != nil {
		return err
	}
	c.apiserver = p
	httpClient, err := rest.HTTPClientFor(c.adminCfg)
	if err != nil {
		return fmt.Errorf("admin http client: %w", err)
	}
	defer httpClient.CloseIdleConnections()
	return waitReady(ctx, p, httpClient, c.host+"/readyz")
}

// AdvanceRevision writes a key of its own into etcd directly (through etcd's JSON
// gateway: the apiserver may be stopped), which moves etcd's revision, and so the
// resource version of everything, past every version a client holds now. An
// apiserver started after it begins its watch cache there: a watch resumed from
// an earlier version is answered 410 Gone (too old resource version), and its
// client lists again. Without it, whether a restarted apiserver can resume a
// client's watch depends on whether anything was written in between.
func (c *ControlPlane) AdvanceRevision(ctx context.Context) error {
	enc := base64.StdEncoding.EncodeToString
	body := fmt.Sprintf(`{"key":%q,"value":%q}`, enc([]byte("/istio-cni-test/advance-revision")), enc([]byte(time.Now().String())))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+"/v3/kv/put", strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd put: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd put: %s: %s", resp.Status, answer)
	}
	return nil
}
