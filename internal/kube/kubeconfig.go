package kube

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Kubeconfig is the part of a kubeconfig file the plugin needs: the current
// context's server, CA and credentials. It reads both YAML and JSON.
type Kubeconfig struct {
	Server                string
	CAData                []byte
	InsecureSkipTLSVerify bool
	Token                 string
	TokenFile             string
	ClientCertData        []byte
	ClientKeyData         []byte
}

// kubeconfigFile is what ParseKubeconfig reads of a kubeconfig (decodeKubeconfig).
type kubeconfigFile struct {
	CurrentContext string              `json:"current-context"`
	Clusters       []kubeconfigCluster `json:"clusters"`
	Contexts       []kubeconfigContext `json:"contexts"`
	Users          []kubeconfigUser    `json:"users"`
}

type kubeconfigCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server                   string `json:"server"`
		CertificateAuthority     string `json:"certificate-authority"`
		CertificateAuthorityData string `json:"certificate-authority-data"`
		InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
	} `json:"cluster"`
}

type kubeconfigContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

type kubeconfigUser struct {
	Name string `json:"name"`
	User struct {
		Token                 string `json:"token"`
		TokenFile             string `json:"tokenFile"`
		ClientCertificate     string `json:"client-certificate"`
		ClientCertificateData string `json:"client-certificate-data"`
		ClientKey             string `json:"client-key"`
		ClientKeyData         string `json:"client-key-data"`
	} `json:"user"`
}

// MaxFileBytes bounds each file the plugin reads for its API client: the
// kubeconfig and the files it names (CA, client certificate and key, token). Real
// ones are a few KiB; a larger file is refused naming it.
const MaxFileBytes = 1 << 20

// readFile reads path, refusing a file over MaxFileBytes.
func readFile(path string) ([]byte, error) { return readBounded(path, MaxFileBytes) }

// readBounded reads path whole, refusing a file over max bytes; an error opening
// it is returned as is (fs.ErrNotExist stays testable).
func readBounded(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// LoadKubeconfig reads a kubeconfig file. Relative file references resolve against
// the file's directory, as kubectl does.
func LoadKubeconfig(path string) (*Kubeconfig, error) {
	raw, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig: %w", err)
	}
	kc, err := ParseKubeconfig(raw, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return kc, nil
}

// ParseKubeconfig parses kubeconfig YAML (the part of YAML yamlToJSON reads) or
// JSON; dir resolves relative paths.
func ParseKubeconfig(raw []byte, dir string) (*Kubeconfig, error) {
	js, err := yamlToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var f kubeconfigFile
	if err := decodeKubeconfig(js, &f); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	ctxName := f.CurrentContext
	if ctxName == "" && len(f.Contexts) == 1 {
		ctxName = f.Contexts[0].Name
	}
	var clusterName, userName string
	found := false
	for _, c := range f.Contexts {
		if c.Name == ctxName {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		if len(f.Clusters) != 1 {
			return nil, fmt.Errorf("current context %q not found", ctxName)
		}
		clusterName = f.Clusters[0].Name
		if len(f.Users) == 1 {
			userName = f.Users[0].Name
		}
	}
	kc := &Kubeconfig{}
	resolve := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(dir, p)
		}
		return p
	}
	readData := func(field, data, file string) ([]byte, error) {
		if data != "" {
			b, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return nil, fmt.Errorf("%s: not base64: %w", field, err)
			}
			return b, nil
		}
		if file != "" {
			b, err := readFile(resolve(file))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			return b, nil
		}
		return nil, nil
	}
	clusterFound := false
	for _, c := range f.Clusters {
		if c.Name != clusterName {
			continue
		}
		clusterFound = true
		kc.Server = c.Cluster.Server
		kc.InsecureSkipTLSVerify = c.Cluster.InsecureSkipTLSVerify
		if kc.CAData, err = readData("certificate-authority", c.Cluster.CertificateAuthorityData, c.Cluster.CertificateAuthority); err != nil {
			return nil, err
		}
	}
	if !clusterFound || kc.Server == "" {
		return nil, fmt.Errorf("cluster %q has no server", clusterName)
	}
	for _, u := range f.Users {
		if u.Name != userName {
			continue
		}
		kc.Token, kc.TokenFile = u.User.Token, resolve(u.User.TokenFile)
		if kc.ClientCertData, err = readData("client-certificate", u.User.ClientCertificateData, u.User.ClientCertificate); err != nil {
			return nil, err
		}
		if kc.ClientKeyData, err = readData("client-key", u.User.ClientKeyData, u.User.ClientKey); err != nil {
			return nil, err
		}
	}
	return kc, nil
}
