package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// The time bounds of a push. The first contact (the registry's /v2/ endpoint, the
// credentials exchange and a look at the tag) must finish within answerBound: a
// registry that is down, does not answer, is not trusted or refuses the
// credentials fails within it, before anything is uploaded. Each later request
// may wait requestBound for the registry's answer once it is sent; the whole push
// is bounded by the -timeout flag.
const (
	answerBound  = 15 * time.Second
	dialBound    = 10 * time.Second
	requestBound = 30 * time.Second
)

// registryClient holds how we talk to one registry: TLS roots, credentials, bounds.
type registryClient struct {
	transport http.RoundTripper
	keychain  authn.Keychain
	// caFile is the extra CA the user gave, named in errors ("" when none).
	caFile string
	// timeout bounds the whole push (the -timeout flag), named in errors.
	timeout time.Duration
}

// newRegistryClient trusts the system's roots plus, when caFile is set, every
// certificate in it, and takes credentials from the user's docker config and
// credential helpers (authn.DefaultKeychain: $DOCKER_CONFIG/config.json or
// ~/.docker/config.json, its credsStore and credHelpers, and podman's auth.json),
// as crane and skopeo do.
func newRegistryClient(caFile string) (*registryClient, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", caFile)
		}
	}
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialBound, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   dialBound,
		ResponseHeaderTimeout: requestBound,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
		ForceAttemptHTTP2:     true,
	}
	return &registryClient{transport: t, keychain: authn.DefaultKeychain, caFile: caFile}, nil
}

func (c *registryClient) options(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(c.transport),
		remote.WithAuthFromKeychain(c.keychain),
		remote.WithUserAgent("istio-cni-push"),
		// A short retry of network hiccups; the bounds above cap the waiting.
		remote.WithRetryBackoff(remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	}
}

// current is the digest ref's tag names in the registry now, or the zero hash when
// the tag does not exist yet. It is the first contact with the registry, bounded by
// answerBound.
func (c *registryClient) current(ctx context.Context, ref name.Tag) (v1.Hash, error) {
	ctx, cancel := context.WithTimeout(ctx, answerBound)
	defer cancel()
	desc, err := remote.Head(ref, c.options(ctx)...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return v1.Hash{}, nil
	}
	if err != nil {
		return v1.Hash{}, c.explain(ref.Context().Registry, ctx, err, fmt.Sprintf("%s, the bound of the first contact", answerBound))
	}
	return desc.Digest, nil
}

// explain turns a failed exchange with reg into an error that names the registry,
// the reason in words and what to do about it.
func (c *registryClient) explain(reg name.Registry, ctx context.Context, err error, bound string) error {
	host := reg.RegistryStr()
	var (
		unknownCA  x509.UnknownAuthorityError
		invalid    x509.CertificateInvalidError
		hostname   x509.HostnameError
		notTLS     tls.RecordHeaderError
		terr       *transport.Error
		dnsErr     *net.DNSError
		netErr     net.Error
		trustHint  = "give the CA that signed it with CA_FILE=/path/to/ca.pem (make push) or -ca-file"
		credsHint  = fmt.Sprintf("credentials come from the docker config ($DOCKER_CONFIG/config.json or ~/.docker/config.json) and its credential helpers: log in with `docker login %s` (or crane auth login, podman login)", host)
		authConfig = c.describeCredentials(reg)
	)
	if c.caFile != "" {
		trustHint = fmt.Sprintf("the CA file %s does not hold the CA that signed it", c.caFile)
	}
	switch {
	case errors.As(err, &unknownCA):
		return fmt.Errorf("registry %s: TLS: its certificate is signed by an unknown authority (%s): %s", host, certSubject(unknownCA.Cert), trustHint)
	case errors.As(err, &hostname):
		return fmt.Errorf("registry %s: TLS: its certificate is not valid for %s (%v)", host, hostname.Host, hostname)
	case errors.As(err, &invalid):
		return fmt.Errorf("registry %s: TLS: its certificate is not valid: %v", host, invalid)
	case errors.As(err, &notTLS):
		return fmt.Errorf("registry %s: it does not answer in TLS (plain HTTP?); push needs HTTPS", host)
	case errors.As(err, &terr):
		switch terr.StatusCode {
		case http.StatusUnauthorized:
			return fmt.Errorf("registry %s: authentication failed (HTTP 401) with %s: %s (%v)", host, authConfig, credsHint, terr)
		case http.StatusForbidden:
			return fmt.Errorf("registry %s refused the push (HTTP 403) for %s: that account may not push there (%v)", host, authConfig, terr)
		default:
			return fmt.Errorf("registry %s refused the push (HTTP %d %s): %v", host, terr.StatusCode, http.StatusText(terr.StatusCode), terr)
		}
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("registry %s: connection refused: nothing listens there (is the registry running, are the host and port right?)", host)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("registry %s: cannot resolve %s: %v", host, dnsErr.Name, dnsErr.Err)
	case ctx.Err() != nil:
		return fmt.Errorf("registry %s: no answer within %s: %w", host, bound, err)
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return fmt.Errorf("registry %s did not answer in time (connect and TLS %s, a response %s): %w", host, dialBound, requestBound, err)
	}
	return fmt.Errorf("registry %s: %w", host, err)
}

// describeCredentials says which credentials the keychain found for reg, without
// showing them.
func (c *registryClient) describeCredentials(reg name.Registry) string {
	a, err := c.keychain.Resolve(reg)
	if err != nil {
		return fmt.Sprintf("no usable credentials (%v)", err)
	}
	if a == authn.Anonymous {
		return "no credentials (none found for " + reg.RegistryStr() + ")"
	}
	cfg, err := a.Authorization()
	switch {
	case err != nil:
		return fmt.Sprintf("credentials that cannot be read (%v)", err)
	case cfg.Username != "":
		return fmt.Sprintf("the credentials of user %q", cfg.Username)
	case cfg.IdentityToken != "" || cfg.RegistryToken != "":
		return "a token"
	}
	return "the credentials found"
}

func certSubject(c *x509.Certificate) string {
	if c == nil {
		return "no certificate"
	}
	return fmt.Sprintf("subject %q, issuer %q", c.Subject.String(), c.Issuer.String())
}
