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

// AgentClient reads pods from the node agent's pod cache (package podcache) over its
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
	u := "http://agent/v1/pods/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent pod cache: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("agent pod cache: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, fmt.Errorf("agent pod cache: %w", ErrNotFound)
	default:
		return nil, fmt.Errorf("agent pod cache answered %d: %s", resp.StatusCode, body)
	}
	var pod Pod
	if err := json.Unmarshal(body, &pod); err != nil {
		return nil, fmt.Errorf("agent pod cache: decode: %w", err)
	}
	return &pod, nil
}
