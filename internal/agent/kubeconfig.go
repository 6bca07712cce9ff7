package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// Kubeconfig renders the plugin's kubeconfig: the API server of the settings, the
// CA (unless TLS verification is skipped) and the agent's ServiceAccount token,
// inline so the file stands alone on the host. Pure: the caller reads the files.
// A kubeconfig over kube.MaxFileBytes, which the plugin would refuse on every
// lookup, is refused here, naming the CA file and its size (inline in base64 it
// takes 4/3 of it): a CA file over about 760 KiB does not fit.
func Kubeconfig(s *Settings, token, caPEM []byte) ([]byte, error) {
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return nil, fmt.Errorf("service account token %s is empty", s.TokenFile())
	}
	if bytes.ContainsAny(token, "\r\n") {
		return nil, fmt.Errorf("service account token %s holds more than one line", s.TokenFile())
	}
	type cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
		InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify,omitempty"`
	}
	c := cluster{Server: s.KubeProtocol + "://" + net.JoinHostPort(s.KubeHost, strconv.Itoa(int(s.KubePort)))}
	if s.SkipTLSVerify {
		c.InsecureSkipTLSVerify = true
	} else {
		if err := checkCA(caPEM); err != nil {
			return nil, fmt.Errorf("CA file %s: %w (or set SKIP_TLS_VERIFY=true)", s.CAFile(), err)
		}
		c.CertificateAuthorityData = caPEM
	}
	doc := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"clusters":        []any{map[string]any{"name": "local", "cluster": c}},
		"users":           []any{map[string]any{"name": "istio-cni", "user": map[string]string{"token": string(token)}}},
		"contexts":        []any{map[string]any{"name": "istio-cni-context", "context": map[string]string{"cluster": "local", "user": "istio-cni"}}},
		"current-context": "istio-cni-context",
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode kubeconfig: %w", err)
	}
	out = append([]byte("# Kubeconfig of the istio-cni plugin, written by install-cni; rewritten when the token rotates.\n"), out...)
	if len(out) > kube.MaxFileBytes {
		what := fmt.Sprintf("its token is %d bytes", len(token))
		if len(c.CertificateAuthorityData) > 0 {
			what = fmt.Sprintf("CA file %s is %d bytes, inline in base64 (4/3 of its size), and the token %d bytes", s.CAFile(), len(caPEM), len(token))
		}
		return nil, fmt.Errorf("the plugin's kubeconfig would be %d bytes, over the plugin's limit of %d: %s", len(out), kube.MaxFileBytes, what)
	}
	return out, nil
}

// checkCA refuses a CA file that holds no certificate: the plugin would fail every
// lookup with an unhelpful TLS error on the node.
func checkCA(data []byte) error {
	rest := data
	found := false
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("bad certificate: %w", err)
		}
		found = true
	}
	if !found {
		return errors.New("holds no PEM certificate")
	}
	return nil
}

// readCredentials reads the agent's token (when the plugin uses it) and, unless TLS
// verification is skipped, the CA, each through readCredential.
func readCredentials(s *Settings) (token, ca []byte, err error) {
	if s.PluginServiceAccount == "" {
		if token, err = readCredential(s.TokenFile()); err != nil {
			return nil, nil, fmt.Errorf("read service account token: %w", err)
		}
	}
	if !s.SkipTLSVerify {
		if ca, err = readCredential(s.CAFile()); err != nil {
			return nil, nil, fmt.Errorf("read CA for the plugin's kubeconfig: %w", err)
		}
	}
	return token, ca, nil
}

// readCredential reads a token or CA file, refusing one over kube.MaxFileBytes (the
// plugin's own limit for each file it reads) and anything but a regular file (a
// symbolic link to one, as a projected volume's, is followed): it is opened without
// blocking, so a FIFO in its place does not hold the agent's loop, and read through
// a bound, so a device or a growing file is not read without end.
func readCredential(path string) ([]byte, error) {
	return regularfile.ReadBounded(path, kube.MaxFileBytes)
}
