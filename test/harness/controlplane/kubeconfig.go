package controlplane

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// authInfo is how a kubeconfig's user proves who it is: a client certificate or a
// bearer token.
type authInfo struct {
	certPEM, keyPEM []byte
	token           string
}

// writeKubeconfig writes a self-contained kubeconfig (CA and credentials inline, so
// it can be copied elsewhere, e.g. into a CNI config dir) and returns its path. The
// write goes through a rename so a reader never sees half a file.
func writeKubeconfig(path, host string, caPEM []byte, user string, auth authInfo) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: auth.certPEM,
		ClientKeyData:         auth.keyPEM,
		Token:                 auth.token,
	}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: user}
	cfg.CurrentContext = user
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return "", fmt.Errorf("encode kubeconfig for %s: %w", user, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("create kubeconfig dir: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}
