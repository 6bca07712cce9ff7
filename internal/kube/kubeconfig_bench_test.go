package kube

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

// agentKubeconfig is a kubeconfig of the shape the agent writes for the plugin
// (internal/agent.Kubeconfig): a comment line, the CA inline (a 2048-bit RSA
// certificate, base64 of its PEM) and a ServiceAccount token of about 1 KB.
func agentKubeconfig(tb testing.TB) []byte {
	tb.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	token := "eyJhbGciOiJSUzI1NiIsImtpZCI6IkJ" + strings.Repeat("a1B2c3D4e5F6g7H8i9J0-_", 43)
	return []byte(`# Kubeconfig of the istio-cni plugin, written by install-cni; rewritten when the token rotates.
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: ` + ca + `
    server: https://10.96.0.1:443
  name: local
contexts:
- context:
    cluster: local
    user: istio-cni
  name: istio-cni-context
current-context: istio-cni-context
kind: Config
users:
- name: istio-cni
  user:
    token: ` + token + `
`)
}

// BenchmarkParseKubeconfig parses the plugin's kubeconfig as every ADD that asks
// the API server does (docs/performance.md, twenty-fifth pass).
func BenchmarkParseKubeconfig(b *testing.B) {
	raw := agentKubeconfig(b)
	dir := b.TempDir()
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := ParseKubeconfig(raw, dir); err != nil {
			b.Fatal(err)
		}
	}
}
