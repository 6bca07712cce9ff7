package controlplane

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
)

// ClientCertKubeconfig writes to path a kubeconfig whose client certificate, signed
// by the control plane's CA, authenticates as user in groups (the certificate's CN
// and O), and returns path. This is how components that live beside the control
// plane get their identity: a kubelet as "system:node:NAME" in "system:nodes", the
// scheduler as "system:kube-scheduler", the controller-manager as
// "system:kube-controller-manager"; the apiserver's bootstrap RBAC and the Node
// authorizer already know these names.
func (c *ControlPlane) ClientCertKubeconfig(path, user string, groups []string) (string, error) {
	if user == "" {
		return "", errors.New("client certificate: empty user name")
	}
	certPEM, keyPEM, err := c.keys.ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return "", err
	}
	return writeKubeconfig(path, c.host, c.caData, user, authInfo{certPEM: certPEM, keyPEM: keyPEM})
}
