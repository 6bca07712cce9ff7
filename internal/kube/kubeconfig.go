package kube

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/istio-cni/istio-cni/internal/jsontree"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// Kubeconfig is the part of a kubeconfig file the plugin needs: the current
// context's server, CA and credentials. It reads both YAML and JSON.
type Kubeconfig struct {
	Server                string
	CAData                []byte
	InsecureSkipTLSVerify bool
	// TLSServerName is the name the server's certificate is checked against (and
	// sent in SNI) instead of the server URL's host: tls-server-name.
	TLSServerName  string
	Token          string
	TokenFile      string
	ClientCertData []byte
	ClientKeyData  []byte
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
		TLSServerName            string `json:"tls-server-name"`
		ProxyURL                 string `json:"proxy-url"` // refused
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
		// Read only to be refused: credentials and impersonation this client
		// does not implement (requests would go out without them).
		Username     string          `json:"username"`
		Password     string          `json:"password"`
		Exec         json.RawMessage `json:"exec"`
		AuthProvider json.RawMessage `json:"auth-provider"`
		As           string          `json:"as"`
		AsUID        string          `json:"as-uid"`
		AsGroups     json.RawMessage `json:"as-groups"`
		AsUserExtra  json.RawMessage `json:"as-user-extra"`
	} `json:"user"`
}

// MaxFileBytes bounds each file the plugin reads for its API client: the
// kubeconfig and the files it names (CA, client certificate and key, token). Real
// ones are a few KiB; a larger file is refused naming it, and so is anything but a
// regular file (readBounded).
const MaxFileBytes = 1 << 20

// readFile reads path, refusing a file over MaxFileBytes.
func readFile(path string) ([]byte, error) { return readBounded(path, MaxFileBytes) }

// readBounded reads path whole, refusing a file over max bytes and anything but a
// regular file (regularfile.ReadBounded: a FIFO would block the open past every
// bound of the ADD). An error opening it is returned as is (fs.ErrNotExist stays
// testable).
func readBounded(path string, max int) ([]byte, error) { return regularfile.ReadBounded(path, max) }

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
// JSON; dir resolves relative paths. It reads the current context's cluster and
// user, as kubectl does, and refuses what would make it connect otherwise than
// the file says: a current-context, cluster or user named but not there, and the
// settings this client does not implement (refuseUnsupported). An empty
// current-context with exactly one context means that context; a context with no
// user is anonymous, as for kubectl.
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
	if ctxName == "" {
		if len(f.Contexts) != 1 {
			return nil, fmt.Errorf("current-context is empty and contexts holds %d contexts: set current-context to one of them", len(f.Contexts))
		}
		ctxName = f.Contexts[0].Name
	}
	var ctx *kubeconfigContext
	for i := range f.Contexts {
		if f.Contexts[i].Name == ctxName {
			ctx = &f.Contexts[i]
		}
	}
	if ctx == nil {
		return nil, fmt.Errorf("current-context %q: no context of that name in contexts", ctxName)
	}
	var cluster *kubeconfigCluster
	for i := range f.Clusters {
		if f.Clusters[i].Name == ctx.Context.Cluster {
			cluster = &f.Clusters[i]
		}
	}
	if cluster == nil {
		return nil, fmt.Errorf("context %q: cluster %q: no cluster of that name in clusters", ctxName, ctx.Context.Cluster)
	}
	var user *kubeconfigUser
	if ctx.Context.User != "" {
		for i := range f.Users {
			if f.Users[i].Name == ctx.Context.User {
				user = &f.Users[i]
			}
		}
		if user == nil {
			return nil, fmt.Errorf("context %q: user %q: no user of that name in users (requests would go out anonymous)", ctxName, ctx.Context.User)
		}
	}
	if err := refuseUnsupported(cluster, user); err != nil {
		return nil, err
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
	kc.Server = cluster.Cluster.Server
	if kc.Server == "" {
		return nil, fmt.Errorf("cluster %q has no server", cluster.Name)
	}
	kc.InsecureSkipTLSVerify = cluster.Cluster.InsecureSkipTLSVerify
	kc.TLSServerName = cluster.Cluster.TLSServerName
	if kc.CAData, err = readData("certificate-authority", cluster.Cluster.CertificateAuthorityData, cluster.Cluster.CertificateAuthority); err != nil {
		return nil, err
	}
	if user == nil {
		return kc, nil
	}
	kc.Token, kc.TokenFile = user.User.Token, resolve(user.User.TokenFile)
	if kc.ClientCertData, err = readData("client-certificate", user.User.ClientCertificateData, user.User.ClientCertificate); err != nil {
		return nil, err
	}
	if kc.ClientKeyData, err = readData("client-key", user.User.ClientKeyData, user.User.ClientKey); err != nil {
		return nil, err
	}
	return kc, nil
}

// refuseUnsupported refuses the settings of the current cluster and user that
// this client does not implement: left out, they would make it connect otherwise
// than the file says (directly instead of through a proxy, anonymous instead of
// with the credential, as the user instead of whom it impersonates).
//
// It also refuses, as kubectl does (client-go: "specifying a root certificates
// file with the insecure flag is not allowed"), insecure-skip-tls-verify beside a
// CA: the CA would not be checked, and the API server's answers, which decide
// every pod's capture, would be taken from any server.
func refuseUnsupported(cluster *kubeconfigCluster, user *kubeconfigUser) error {
	if p := cluster.Cluster.ProxyURL; p != "" {
		return fmt.Errorf("cluster %q: proxy-url %s: not supported (this client connects to the server directly); remove it, or reach the server without a proxy", cluster.Name, RedactURL(p))
	}
	if c := &cluster.Cluster; c.InsecureSkipTLSVerify && (c.CertificateAuthority != "" || c.CertificateAuthorityData != "") {
		key := "certificate-authority-data"
		if c.CertificateAuthorityData == "" {
			key = "certificate-authority"
		}
		return fmt.Errorf("cluster %q: insecure-skip-tls-verify beside %s: refused, as kubectl does (the CA would not be checked, and the API server's answers would be taken from any server); remove one of them", cluster.Name, key)
	}
	if user == nil {
		return nil
	}
	u := &user.User
	refuse := func(key, value, why string) error {
		if value != "" {
			value = " " + value
		}
		return fmt.Errorf("user %q: %s%s: not supported (%s); give the user a token, tokenFile or client certificate", user.Name, key, value, why)
	}
	switch {
	case given(u.Exec):
		cmd, _ := member(u.Exec, "command")
		return refuse("exec", fmt.Sprintf("(command %q)", cmd), "this client runs no credential plugin")
	case given(u.AuthProvider):
		name, _ := member(u.AuthProvider, "name")
		return refuse("auth-provider", fmt.Sprintf("(name %q)", name), "this client runs no auth provider")
	case u.Username != "":
		return refuse("username", fmt.Sprintf("%q", u.Username), "this client sends no basic authentication")
	case u.Password != "":
		return refuse("password", "", "this client sends no basic authentication")
	case u.As != "":
		return refuse("as", fmt.Sprintf("%q", u.As), "this client does not impersonate")
	case u.AsUID != "":
		return refuse("as-uid", fmt.Sprintf("%q", u.AsUID), "this client does not impersonate")
	case set(u.AsGroups):
		return refuse("as-groups", string(u.AsGroups), "this client does not impersonate")
	case set(u.AsUserExtra):
		return refuse("as-user-extra", string(u.AsUserExtra), "this client does not impersonate")
	}
	return nil
}

// given says whether a value read only to be refused is there: not missing and
// not null.
func given(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// set says whether a list or object read only to be refused is there and not
// empty.
func set(raw json.RawMessage) bool {
	v, err := jsontree.Parse(raw)
	if err != nil {
		return len(raw) > 0
	}
	switch v.Kind {
	case jsontree.Null:
		return false
	case jsontree.String:
		return v.Str() != ""
	case jsontree.Array:
		return len(v.Elems()) > 0
	case jsontree.Object:
		return len(v.Members()) > 0
	}
	return true
}

// member is the string member key of the object raw, if there is one.
func member(raw json.RawMessage, key string) (string, bool) {
	v, err := jsontree.Parse(raw)
	if err != nil {
		return "", false
	}
	return v.StringMember(key)
}

// RedactURL quotes s with any password in it replaced, for an error message.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if strings.Contains(s, "@") {
			return "(not a URL; not quoted, as it may hold a password)"
		}
		return fmt.Sprintf("%q (not a URL)", s)
	}
	if u.Opaque != "" {
		// "user:password@host" parses as scheme "user" and an opaque rest.
		return fmt.Sprintf("%q (the rest not quoted)", u.Scheme+":")
	}
	return fmt.Sprintf("%q", u.Redacted())
}
