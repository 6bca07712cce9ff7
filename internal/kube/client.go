package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Client is a minimal Kubernetes API client: GET of single objects as JSON over
// HTTPS. The plugin is exec'd once per pod, so it avoids client-go's start-up cost
// (type registration, discovery) and size; it needs nothing else.
type Client struct {
	base  *url.URL
	http  *http.Client
	token string
}

// ErrNotFound is returned when the object does not exist.
var ErrNotFound = errors.New("not found")

// NewClient builds a client from a kubeconfig. timeout bounds each request.
func NewClient(kc *Kubeconfig, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(kc.Server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("kubeconfig server %q is not a URL", kc.Server)
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: kc.InsecureSkipTLSVerify} //nolint:gosec // only when the kubeconfig asks for it
	if len(kc.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(kc.CAData) {
			return nil, fmt.Errorf("kubeconfig certificate-authority holds no PEM certificate")
		}
		tlsConf.RootCAs = pool
	}
	if len(kc.ClientCertData) > 0 {
		cert, err := tls.X509KeyPair(kc.ClientCertData, kc.ClientKeyData)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig client certificate: %w", err)
		}
		tlsConf.Certificates = []tls.Certificate{cert}
	}
	token := kc.Token
	if token == "" && kc.TokenFile != "" {
		b, err := os.ReadFile(kc.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	tr := &http.Transport{TLSClientConfig: tlsConf, ForceAttemptHTTP2: false, MaxIdleConns: 1, IdleConnTimeout: 30 * time.Second}
	return &Client{base: u, http: &http.Client{Transport: tr, Timeout: timeout}, token: token}, nil
}

// StatusError is an API error response.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("API server answered %d %s: %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("API server answered %d %s", e.Code, http.StatusText(e.Code))
}

// Get fetches path (e.g. /api/v1/namespaces/ns/pods/name) and decodes it into out.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "istio-cni")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("GET %s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var st struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(body, &st)
		serr := &StatusError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("GET %s: %w: %w", path, ErrNotFound, serr)
		}
		return fmt.Errorf("GET %s: %w", path, serr)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("GET %s: %w", path, &DecodeError{Err: err, Size: len(body)})
	}
	return nil
}

// DecodeError is an answer with status 200 that is not the JSON asked for.
type DecodeError struct {
	Err  error
	Size int
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("the %d-byte answer does not decode: %v", e.Size, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// PodPath is the API path of a pod.
func PodPath(namespace, name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
}
