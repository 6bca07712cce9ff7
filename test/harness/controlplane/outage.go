package controlplane

import (
	"context"
	"fmt"
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
