package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/http1"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// Client is a minimal Kubernetes API client: GET of single objects over HTTPS, a
// pod in protobuf and anything else in JSON. The plugin is exec'd once per pod, so
// it avoids client-go's start-up cost (type registration, discovery) and size, and
// net/http's (package http1): each GET is one HTTP/1.1 exchange on its own
// connection.
type Client struct {
	base    *url.URL
	addr    string // host:port to dial
	tls     *tls.Config
	token   string
	timeout time.Duration

	sessions   *SessionFile // nil: every connection makes a full handshake
	resumed    bool         // the last connection resumed a stored TLS session
	curve      tls.CurveID  // the last connection's key exchange
	sessionErr error        // the last Save's error
	encoding   string       // the last answer's: EncodingProtobuf or EncodingJSON
}

// The encodings of an answer, as Encoding names them.
const (
	EncodingProtobuf = "protobuf"
	EncodingJSON     = "json"
)

// Encoding names the encoding of the last answer with status 200; empty before
// one.
func (c *Client) Encoding() string { return c.encoding }

// ErrNotFound is returned when the object does not exist.
var ErrNotFound = errors.New("not found")

// MaxAnswerBytes bounds an answer's body (a pod is a few KiB; 16 MiB is far beyond
// any object the API server stores, whose limit is 1.5 MiB in etcd).
const MaxAnswerBytes = 16 << 20

// NewClient builds a client from a kubeconfig. timeout bounds each request.
func NewClient(kc *Kubeconfig, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(kc.Server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("kubeconfig server %s is not an http(s) URL", RedactURL(kc.Server))
	}
	token, err := bearerToken(kc)
	if err != nil {
		return nil, err
	}
	c := &Client{base: u, addr: u.Host, token: token, timeout: timeout}
	if u.Port() == "" {
		port := "443"
		if u.Scheme == "http" {
			port = "80"
		}
		c.addr = net.JoinHostPort(u.Hostname(), port)
	}
	if u.Scheme == "https" {
		serverName := u.Hostname()
		if kc.TLSServerName != "" {
			serverName = kc.TLSServerName
		}
		c.tls = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: kc.InsecureSkipTLSVerify, //nolint:gosec // only when the kubeconfig asks for it
			ServerName: serverName, NextProtos: []string{"http/1.1"}}
		if len(kc.CAData) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(kc.CAData) {
				return nil, fmt.Errorf("kubeconfig certificate-authority holds no PEM certificate")
			}
			c.tls.RootCAs = pool
		}
		if len(kc.ClientCertData) > 0 {
			cert, err := tls.X509KeyPair(kc.ClientCertData, kc.ClientKeyData)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig client certificate: %w", err)
			}
			c.tls.Certificates = []tls.Certificate{cert}
		}
	}
	return c, nil
}

// bearerToken is the token the client sends, chosen as client-go chooses it: the
// token file's when tokenFile is set (read once: the plugin runs once per pod),
// the inline token when the file cannot be read or is empty, as client-go falls
// back to it. A token file that gives no token, with no inline token behind it,
// is an error naming the file (client-go: "read empty token from file").
func bearerToken(kc *Kubeconfig) (string, error) {
	if kc.TokenFile == "" {
		return kc.Token, nil
	}
	b, err := readFile(kc.TokenFile)
	if err == nil {
		if token := strings.TrimSpace(string(b)); token != "" {
			return token, nil
		}
		err = fmt.Errorf("%s is empty", kc.TokenFile)
	}
	if kc.Token != "" {
		return kc.Token, nil
	}
	return "", fmt.Errorf("kubeconfig tokenFile: %w", err)
}

// TokenExpiry is when the client's bearer token expires by its exp claim; ok is
// false without a token, or for one that is not a JWT with iat and exp claims.
func (c *Client) TokenExpiry() (exp time.Time, ok bool) {
	_, e, ok := TokenTimes([]byte(c.token))
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(e, 0), true
}

// TokenTimes reads the iat and exp claims of a JWT's payload (a ServiceAccount
// token), without checking its signature (the API server issued it; only its
// times are wanted).
func TokenTimes(token []byte) (iat, exp int64, ok bool) {
	c, ok := ReadTokenClaims(token)
	if !ok || c.IssuedAt <= 0 || c.ExpiresAt <= 0 {
		return 0, 0, false
	}
	return c.IssuedAt, c.ExpiresAt, true
}

// TokenClaims are the claims of a ServiceAccount token that its holders read.
type TokenClaims struct {
	IssuedAt  int64 `json:"iat"`
	ExpiresAt int64 `json:"exp"`
	// Kubernetes holds the uid of the ServiceAccount the token was issued for: the
	// API server refuses the token once no ServiceAccount of that uid exists (it
	// was deleted, or deleted and created again under the same name).
	Kubernetes struct {
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
		// Node is the node the token is bound to (a node-bound token, refused once
		// no node of that uid exists), or the node of the pod it is bound to (a
		// pod's projected token, which the kubelet renews with its node's uid).
		Node struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

// ReadTokenClaims decodes a JWT's payload, without checking its signature (the
// API server issued it and checks it; its holder only reads it); ok is false for
// a token that is not a JWT with a JSON payload.
func ReadTokenClaims(token []byte) (c TokenClaims, ok bool) {
	parts := bytes.Split(token, []byte("."))
	if len(parts) != 3 {
		return c, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(string(bytes.TrimRight(parts[1], "=")))
	if err != nil {
		return c, false
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return TokenClaims{}, false
	}
	return c, true
}

// ResumeSessions makes the client offer the TLS session stored at path and store
// the one of a full handshake there (see SessionFile). An https client only;
// for others it does nothing.
func (c *Client) ResumeSessions(path string, kc *Kubeconfig) {
	if c.tls == nil {
		return
	}
	c.sessions = NewSessionFile(path, kc, c.tls.ServerName)
	c.tls.ClientSessionCache = c.sessions
}

// Resumed says whether the last connection resumed a stored TLS session, and
// the error of storing its session, if any (the lookup does not fail for it).
func (c *Client) Resumed() (bool, error) { return c.resumed, c.sessionErr }

// KeyExchange names the last TLS connection's key exchange (X25519MLKEM768, or
// X25519 on a resumed one: see resumeCurves); empty before one.
func (c *Client) KeyExchange() string {
	if c.curve == 0 {
		return ""
	}
	return c.curve.String()
}

// StatusError is an API error response.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("API server answered %d %s: %s", e.Code, e.Reason, e.Message)
	}
	if e.Reason != "" {
		return fmt.Sprintf("API server answered %d %s", e.Code, e.Reason)
	}
	return fmt.Sprintf("API server answered HTTP %d", e.Code)
}

// Get fetches path (e.g. /api/v1/namespaces/ns/pods/name) and decodes it into out.
// The client's timeout bounds the whole exchange, connection and TLS handshake
// included.
//
// A pod is asked for in protobuf, JSON accepted (see ProtobufContentType); every
// other object in JSON.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	accept := "application/json"
	pod, isPod := out.(*Pod)
	if isPod {
		accept = ProtobufContentType + ", application/json"
	}
	resp, err := c.get(ctx, strings.TrimSuffix(c.base.EscapedPath(), "/")+path, accept)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != 200 {
		var st struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		if isProtobuf(resp.Body) {
			_ = decodeStatusErrorProtobuf(resp.Body, &st.Reason, &st.Message)
		} else {
			_ = json.Unmarshal(resp.Body, &st)
		}
		serr := &StatusError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
		if resp.StatusCode == 404 {
			return fmt.Errorf("GET %s: %w: %w", path, ErrNotFound, serr)
		}
		return fmt.Errorf("GET %s: %w", path, serr)
	}
	if isPod && isProtobuf(resp.Body) {
		c.encoding = EncodingProtobuf
		err = decodePodProtobuf(resp.Body, pod)
	} else {
		c.encoding = EncodingJSON
		err = decodeJSON(resp.Body, out)
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, &DecodeError{Err: err, Size: len(resp.Body)})
	}
	return nil
}

func (c *Client) get(ctx context.Context, path, accept string) (*http1.Response, error) {
	var conn net.Conn
	var err error
	if c.tls != nil {
		conn, err = c.dialTLS(ctx)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", c.addr)
	}
	timing.Mark(ctx, "api-connect") // TCP and TLS handshake
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) }) // cancellation unblocks the exchange
	defer stop()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	h := [][2]string{{"Accept", accept}, {"User-Agent", "istio-cni"}}
	if c.token != "" {
		h = append(h, [2]string{"Authorization", "Bearer " + c.token})
	}
	resp, err := http1.Do(conn, http1.Request{Method: "GET", Host: c.base.Host, Path: path, Header: h}, MaxAnswerBytes)
	if tc, ok := conn.(*tls.Conn); ok && c.sessions != nil && err == nil {
		// The answer is read: TLS 1.3's tickets, sent after the handshake, came
		// before it.
		cs := tc.ConnectionState()
		c.resumed, c.curve = cs.DidResume, cs.CurveID
		c.sessionErr = c.sessions.Save(c.resumed)
	}
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return resp, err
}

// resumeCurves are the key exchanges a connection offering a stored session
// offers: X25519 (its key share), and P-256 for a server without it (a FIPS
// build's), without the post-quantum half of Go's default (X25519MLKEM768),
// whose key generation and decapsulation are about a third of a resumed
// handshake here (docs/performance.md, twenty-first pass).
//
// Resumed that way, the connection is still post-quantum: TLS 1.3 (psk_dhe_ke)
// derives its keys from the session's secret and the new exchange together, and
// the session's secret came from a full handshake with the default hybrid
// exchange (SessionFile stores only those), so decrypting recorded traffic takes
// that secret, which no recording of either handshake gives. What the classical
// exchange weakens is forward secrecy against a later theft of the session file
// by someone who can also break X25519: the file sits beside the plugin's
// kubeconfig, whose token would be stolen with it.
var resumeCurves = []tls.CurveID{tls.X25519, tls.CurveP256}

// dialTLS connects and makes the TLS handshake. When a stored session is
// offered, the key exchanges are resumeCurves' (unless a server refused one
// offered so in the last ClassicalPause). A server that does not resume the
// session (its ticket keys changed, as on an API server's restart; another API
// server behind the same address) has then made a full handshake with a
// classical exchange alone, and nothing is sent on that connection: it is
// closed, the session forgotten and the refusal recorded, and the connection
// made again with the default exchanges. One whose handshake fails is made
// again the same way, the session still offered.
func (c *Client) dialTLS(ctx context.Context) (net.Conn, error) {
	if c.sessions != nil {
		if c.sessions.OfferClassical() {
			cfg := c.tls.Clone()
			cfg.CurvePreferences = resumeCurves
			cfg.ClientSessionCache = keepOnFailure{c.sessions}
			conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", c.addr)
			switch {
			case err == nil && conn.(*tls.Conn).ConnectionState().DidResume:
				return conn, nil
			case err == nil:
				conn.Close()
				c.sessions.Refused()
			case dialFailed(err) || ctx.Err() != nil:
				return nil, err
			}
		}
	}
	return (&tls.Dialer{Config: c.tls}).DialContext(ctx, "tcp", c.addr)
}

// keepOnFailure is the session store of the handshake with resumeCurves:
// crypto/tls voids the offered session when a handshake that offered it fails,
// which here says only that the server wants another key exchange, and the
// connection made again with the default offers it still. dialTLS voids it
// itself when the server does not resume it.
type keepOnFailure struct{ *SessionFile }

func (k keepOnFailure) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		k.SessionFile.Put(key, cs)
	}
}

// dialFailed says whether err is the TCP connection's failure rather than the
// TLS handshake's.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// DecodeError is an answer with status 200 that is not the JSON asked for.
type DecodeError struct {
	Err  error
	Size int
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("the %d-byte answer does not decode: %v", e.Size, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// FromCache asks the API server to answer path from its watch cache
// (resourceVersion=0: any version it holds) instead of a quorum read from etcd,
// which halves a GET on a quiet control plane. The answer may be a little behind
// etcd, or missing for an object created a moment ago on another API server: a
// caller takes it only when it is the object it wants, else reads again without.
func FromCache(path string) string { return path + "?resourceVersion=0" }

// PodPath is the API path of a pod.
func PodPath(namespace, name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
}
