// Package registry runs a real OCI registry for the tests: the distribution
// registry (the reference implementation, the program in Docker's registry image),
// built from the Go module proxy by hack/registry-binary.sh, on loopback with TLS
// from a CA of its own and htpasswd (bcrypt) basic auth, its storage in the test's
// directory. Tests push to it with the project's push command and pull from it
// through containerd.
package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/istio-cni/istio-cni/test/harness/childproc"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// ReadyBound is how long Start waits for the registry to answer.
const ReadyBound = 30 * time.Second

// Options of a registry.
type Options struct {
	// Dir holds its config, certificate, htpasswd file, storage and log; the
	// caller removes it (t.TempDir()).
	Dir string
	// ReadOnly puts the storage in maintenance read-only mode: every push is refused.
	ReadOnly bool
}

// Registry is a running registry.
type Registry struct {
	// Host is host:port as image names carry it: 127.0.0.1:PORT.
	Host string
	// CAFile is the PEM of the CA that signed the registry's certificate (valid for
	// 127.0.0.1 and localhost); CAPEM is its content.
	CAFile string
	CAPEM  []byte
	// User and Password are the one account htpasswd knows.
	User, Password string
	// LogPath is the registry's log.
	LogPath string

	launcher *childproc.Launcher
	proc     *childproc.Process
}

// Binary builds (first run only) and returns the registry binary.
func Binary(ctx context.Context, repoRoot string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "registry-binary.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/registry-binary.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Start runs the registry and waits until it answers (at most ReadyBound).
func Start(ctx context.Context, repoRoot string, opts Options) (*Registry, error) {
	bin, err := Binary(ctx, repoRoot)
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		return nil, errors.New("registry: Options.Dir is required")
	}
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return nil, err
	}
	port := ports[0]
	r := &Registry{
		Host:     "127.0.0.1:" + strconv.Itoa(port),
		CAFile:   filepath.Join(opts.Dir, "ca.pem"),
		User:     "pusher",
		Password: "s3cret-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		LogPath:  filepath.Join(opts.Dir, "registry.log"),
	}
	ca, err := controlplane.NewCA("istio-cni test registry CA")
	if err != nil {
		return nil, err
	}
	r.CAPEM = ca.CertPEM
	certPEM, keyPEM, err := ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "istio-cni test registry"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.pem":   ca.CertPEM,
		"tls.crt":  certPEM,
		"tls.key":  keyPEM,
		"htpasswd": []byte(r.User + ":" + string(hash) + "\n"),
		"config.yml": []byte(fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: %t
http:
  addr: %q
  tls:
    certificate: %q
    key: %q
auth:
  htpasswd:
    realm: istio-cni-test
    path: %q
`, filepath.Join(opts.Dir, "storage"), opts.ReadOnly, r.Host, filepath.Join(opts.Dir, "tls.crt"), filepath.Join(opts.Dir, "tls.key"), filepath.Join(opts.Dir, "htpasswd"))),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(opts.Dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	r.launcher = childproc.NewLauncher()
	// No tracing exporter: the registry would try to reach a collector.
	r.proc, err = r.launcher.Start("registry", bin, []string{"serve", filepath.Join(opts.Dir, "config.yml")},
		[]string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true"}, r.LogPath)
	if err != nil {
		r.launcher.Close()
		return nil, err
	}
	if err := r.waitReady(ctx); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

// waitReady waits until GET /v2/ asks for credentials over TLS.
func (r *Registry) waitReady(ctx context.Context) error {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.CAPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(ReadyBound)
	var last string
	for time.Now().Before(deadline) {
		if !r.proc.Running() {
			return r.proc.ExitError()
		}
		resp, err := client.Get("https://" + r.Host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("registry at %s not ready within %s (last: %s); log:\n%s", r.Host, ReadyBound, last, r.proc.Tail(20))
}

// Stop stops the registry (SIGTERM, SIGKILL after 5 s). Stopping twice is fine.
func (r *Registry) Stop() error {
	if r.proc == nil {
		return nil
	}
	err := r.proc.Stop(5 * time.Second)
	r.launcher.Close()
	r.proc = nil
	return err
}

// DockerConfig writes dir/config.json, a docker config holding user and password
// for the registry (what `docker login` leaves), and returns dir: the value of
// DOCKER_CONFIG for a client that should use those credentials.
func (r *Registry) DockerConfig(dir, user, password string) (string, error) {
	cfg := map[string]any{"auths": map[string]any{
		r.Host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}}
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
}
