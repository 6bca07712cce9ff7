package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the key material of one control plane, as PEM and as the files the
// apiserver reads. ECDSA P-256 keeps generation in the milliseconds even on a busy
// machine; the apiserver accepts it for serving, client auth and ES256 tokens.
type pki struct {
	caCert []byte // PEM

	adminCert []byte // PEM, CN=admin, O=system:masters
	adminKey  []byte // PEM

	caCertFile       string
	servingCertFile  string
	servingKeyFile   string
	saPublicKeyFile  string
	saSigningKeyFile string

	// ca signs the control plane's certificates and any issued later.
	ca *CA
}

// servingNames are the names and addresses clients may use to reach the apiserver:
// loopback from this machine, the advertised address, and the in-cluster service.
func servingNames(advertise net.IP, serviceIP net.IP) ([]string, []net.IP) {
	dns := []string{
		"localhost",
		"kubernetes",
		"kubernetes.default",
		"kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local",
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, advertise, serviceIP}
	return dns, ips
}

func newPKI(dir string, advertise, serviceIP net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := NewCA("istio-cni-controlplane-ca")
	if err != nil {
		return nil, err
	}
	dnsNames, ips := servingNames(advertise, serviceIP)
	servingCert, servingKey, err := ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    dnsNames,
		IPAddresses: ips,
	})
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := ca.Issue(&x509.Certificate{
		// system:masters bypasses authorization entirely, so admin requests work
		// even before the RBAC bootstrap policy exists.
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service-account signing key: %w", err)
	}
	saKeyPEM, err := privateKeyPEM(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("marshal service-account public key: %w", err)
	}

	p := &pki{
		caCert:           ca.CertPEM,
		adminCert:        adminCert,
		adminKey:         adminKey,
		caCertFile:       filepath.Join(dir, "ca.crt"),
		servingCertFile:  filepath.Join(dir, "apiserver.crt"),
		servingKeyFile:   filepath.Join(dir, "apiserver.key"),
		saPublicKeyFile:  filepath.Join(dir, "sa.pub"),
		saSigningKeyFile: filepath.Join(dir, "sa.key"),
		ca:               ca,
	}
	for path, data := range map[string][]byte{
		p.caCertFile:       p.caCert,
		p.servingCertFile:  servingCert,
		p.servingKeyFile:   servingKey,
		p.saPublicKeyFile:  pemBlock("PUBLIC KEY", saPubDER),
		p.saSigningKeyFile: saKeyPEM,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	}
	return p, nil
}

// CA is a throwaway certificate authority, for a control plane or for a node's
// own use (the apiserver's kubelet client certificate). ECDSA P-256 keeps
// generation in the milliseconds even on a busy machine. Its key never leaves
// memory.
type CA struct {
	// CertPEM is the CA certificate, for those who must trust what it issues.
	CertPEM []byte

	cert                *x509.Certificate
	key                 *ecdsa.PrivateKey
	notBefore, notAfter time.Time
}

// NewCA makes a CA named commonName. It and what it issues are valid for a week
// from an hour ago: backdated so that a small clock difference between creation
// and the peer's check cannot make a fresh certificate "not yet valid".
func NewCA(commonName string) (*CA, error) {
	now := time.Now()
	ca := &CA{notBefore: now.Add(-time.Hour), notAfter: now.Add(7 * 24 * time.Hour)}
	var err error
	if ca.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             ca.notBefore,
		NotAfter:              ca.notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, ca.key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	ca.CertPEM = pemBlock("CERTIFICATE", der)
	return ca, nil
}

// Issue signs a certificate for a fresh key pair from tmpl, which names the
// subject, extended key usages and any DNS names and addresses; serial, validity
// and key usage (digital signature) are set here. Both are returned as PEM.
func (ca *CA) Issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key for %q: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = ca.notBefore, ca.notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err = privateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

func privateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still be valid.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
