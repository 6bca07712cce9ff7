package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// AgentClient reads pods and namespaces from the node agent's pod cache (package podcache) over its
// unix socket. It is an accelerator: callers fall back to the API server on any error.
type AgentClient struct {
	http *http.Client
}

// NewAgentClient returns a client for the socket at path; each request is bounded by
// timeout, so a wedged agent costs the plugin little.
func NewAgentClient(path string, timeout time.Duration) *AgentClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
	return &AgentClient{http: &http.Client{Transport: tr, Timeout: timeout}}
}

// GetPod returns the pod from the agent's cache; ErrNotFound when the cache does not
// hold it (which does not mean the API server lacks it).
func (c *AgentClient) GetPod(ctx context.Context, namespace, name string) (*Pod, error) {
	var pod Pod
	if err := c.get(ctx, "/v1/pods/"+url.PathEscape(namespace)+"/"+url.PathEscape(name), &pod); err != nil {
		return nil, err
	}
	return &pod, nil
}

// GetNamespace returns the namespace (its labels) from the agent's cache;
// ErrNotFound when the cache does not hold it (not seen yet, or the agent's watch
// of namespaces is not synced), which does not mean the API server lacks it.
func (c *AgentClient) GetNamespace(ctx context.Context, name string) (*Namespace, error) {
	var ns Namespace
	if err := c.get(ctx, "/v1/namespaces/"+url.PathEscape(name), &ns); err != nil {
		return nil, err
	}
	return &ns, nil
}

func (c *AgentClient) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent pod cache: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("agent pod cache: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("agent pod cache: %w", ErrNotFound)
	default:
		return fmt.Errorf("agent pod cache answered %d: %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("agent pod cache: decode: %w", err)
	}
	return nil
}
