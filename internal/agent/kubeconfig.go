package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"sigs.k8s.io/yaml"
)

// Kubeconfig renders the plugin's kubeconfig: the API server of the settings, the
// CA (unless TLS verification is skipped) and the agent's ServiceAccount token,
// inline so the file stands alone on the host. Pure: the caller reads the files.
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
	return append([]byte("# Kubeconfig of the istio-cni plugin, written by install-cni; rewritten when the token rotates.\n"), out...), nil
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
// verification is skipped, the CA.
func readCredentials(s *Settings) (token, ca []byte, err error) {
	if s.PluginServiceAccount == "" {
		if token, err = os.ReadFile(s.TokenFile()); err != nil {
			return nil, nil, fmt.Errorf("read service account token: %w", err)
		}
	}
	if !s.SkipTLSVerify {
		if ca, err = os.ReadFile(s.CAFile()); err != nil {
			return nil, nil, fmt.Errorf("read CA for the plugin's kubeconfig: %w", err)
		}
	}
	return token, ca, nil
}
