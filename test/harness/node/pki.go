package node

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"path/filepath"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// kubeletClientPKI is how the apiserver proves itself to kubelet (logs, exec,
// port-forward): a CA of the node's own, made before the apiserver starts so its
// --kubelet-client-certificate can point at the files, and trusted by kubelet next
// to the control plane's CA.
type kubeletClientPKI struct {
	caPEM             []byte
	certFile, keyFile string
}

func newKubeletClientPKI(dir string) (*kubeletClientPKI, error) {
	ca, err := controlplane.NewCA("istio-cni-node-kubelet-client-ca")
	if err != nil {
		return nil, fmt.Errorf("node: kubelet-client CA: %w", err)
	}
	certPEM, keyPEM, err := ca.Issue(&x509.Certificate{
		// system:masters: kubelet's webhook authorizer asks the apiserver, which
		// lets this group do anything.
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("node: apiserver kubelet-client certificate: %w", err)
	}
	p := &kubeletClientPKI{
		caPEM:    ca.CertPEM,
		certFile: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		keyFile:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	if err := writeAtomic(p.certFile, certPEM, 0o644); err != nil {
		return nil, err
	}
	if err := writeAtomic(p.keyFile, keyPEM, 0o600); err != nil {
		return nil, err
	}
	return p, nil
}
