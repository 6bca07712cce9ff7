package scale

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// call is one kind of API request, as an agent made it: the verb (get, list,
// watch, create, update, patch, delete), the resource and its scope, and the
// selectors of a list or watch. The proxy counts requests by call.
type call struct {
	Verb, Resource, Namespace, Name, Subresource string
	FieldSelector, LabelSelector                 string
}

func (c call) String() string {
	s := c.Verb + " " + c.Resource
	if c.Subresource != "" {
		s += "/" + c.Subresource
	}
	if c.Namespace != "" {
		s += " ns=" + c.Namespace
	}
	if c.Name != "" {
		s += " name=" + c.Name
	}
	if c.FieldSelector != "" {
		s += " field=" + c.FieldSelector
	}
	if c.LabelSelector != "" {
		s += " label=" + c.LabelSelector
	}
	return s
}

// classify reads a request to the API server as a call. Paths are
// /api/v1/... (core) and /apis/GROUP/VERSION/...; anything else (discovery,
// /version) is a get of its path.
func classify(r *http.Request) call {
	q := r.URL.Query()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return call{Verb: strings.ToLower(r.Method), Resource: r.URL.Path}
	}
	var c call
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
		c.Namespace, rest = rest[1], rest[2:]
	}
	if len(rest) > 0 {
		c.Resource = rest[0]
	}
	if len(rest) > 1 {
		c.Name = rest[1]
	}
	if len(rest) > 2 {
		c.Subresource = rest[2]
	}
	c.FieldSelector, c.LabelSelector = q.Get("fieldSelector"), q.Get("labelSelector")
	switch r.Method {
	case http.MethodGet:
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			c.Verb = "watch"
		case c.Name == "":
			c.Verb = "list"
		default:
			c.Verb = "get"
		}
	case http.MethodPost:
		c.Verb = "create"
	case http.MethodPut:
		c.Verb = "update"
	default:
		c.Verb = strings.ToLower(r.Method)
	}
	return c
}

// traffic is what one agent sent and received through its proxy.
type traffic struct {
	Calls map[call]int
	// Events counts the watch events received, by resource.
	Events map[string]int
	// Bytes is the size of the answer bodies received, by resource, as sent (gzip
	// compressed when large: the API server compresses for client-go); Raw is
	// their size decompressed (protobuf, what the agent decodes).
	Bytes, Raw map[string]int64
	// OpenWatches is the number of watches open now.
	OpenWatches int
}

func subMap(after, before map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for r, n := range after {
		if n -= before[r]; n != 0 {
			d[r] = n
		}
	}
	return d
}

func (t traffic) requests() int {
	n := 0
	for _, v := range t.Calls {
		n += v
	}
	return n
}

// sub is t minus an earlier snapshot (OpenWatches is t's).
func (t traffic) sub(before traffic) traffic {
	d := traffic{Calls: map[call]int{}, Events: map[string]int{}, Bytes: subMap(t.Bytes, before.Bytes), Raw: subMap(t.Raw, before.Raw), OpenWatches: t.OpenWatches}
	for c, n := range t.Calls {
		if n -= before.Calls[c]; n != 0 {
			d.Calls[c] = n
		}
	}
	for r, n := range t.Events {
		if n -= before.Events[r]; n != 0 {
			d.Events[r] = n
		}
	}
	return d
}

// countingProxy is an agent's API server: a TLS reverse proxy to the real one that
// counts every request, answer byte and watch event. The agent's credentials pass
// through untouched, so the API server authenticates and authorizes the agent
// itself. Each agent has its own proxy (and its own connections upstream), as each
// agent has its own connections to a real API server.
type countingProxy struct {
	addr string
	srv  *http.Server
	tr   *http.Transport

	mu sync.Mutex
	t  traffic
}

// proxyCA signs the proxies' serving certificates; the agents trust it as the CA
// of their ServiceAccount.
func newProxyCA() (*controlplane.CA, tls.Certificate, error) {
	ca, err := controlplane.NewCA("scale-proxy-ca")
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	certPEM, keyPEM, err := ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "scale-proxy"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	return ca, cert, err
}

// startProxy serves on a free loopback port until close.
func startProxy(upstream string, upstreamCA []byte, cert tls.Certificate) (*countingProxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(upstreamCA) {
		return nil, fmt.Errorf("upstream CA: no PEM certificate")
	}
	p := &countingProxy{
		tr: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true,
			MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second,
		},
		t: traffic{Calls: map[call]int{}, Events: map[string]int{}, Bytes: map[string]int64{}, Raw: map[string]int64{}},
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		Transport:     p.tr,
		FlushInterval: -1, // watch events go through as they come
		ModifyResponse: func(resp *http.Response) error {
			c := classify(resp.Request)
			body := &countingBody{ReadCloser: resp.Body, p: p, resource: c.Resource}
			body.decode(c.Verb == "watch", strings.Contains(resp.Header.Get("Content-Type"), "protobuf"), resp.Header.Get("Content-Encoding") == "gzip")
			resp.Body = body
			return nil
		},
		ErrorLog: nil,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.addr = ln.Addr().String()
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c := classify(r)
			p.mu.Lock()
			p.t.Calls[c]++
			if c.Verb == "watch" {
				p.t.OpenWatches++
			}
			p.mu.Unlock()
			if c.Verb == "watch" {
				defer func() {
					p.mu.Lock()
					p.t.OpenWatches--
					p.mu.Unlock()
				}()
			}
			rp.ServeHTTP(w, r)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go p.srv.Serve(tls.NewListener(ln, p.srv.TLSConfig))
	return p, nil
}

// snapshot copies the counters.
func (p *countingProxy) snapshot() traffic {
	p.mu.Lock()
	defer p.mu.Unlock()
	return traffic{Calls: maps.Clone(p.t.Calls), Events: maps.Clone(p.t.Events), Bytes: maps.Clone(p.t.Bytes), Raw: maps.Clone(p.t.Raw), OpenWatches: p.t.OpenWatches}
}

func (p *countingProxy) close() {
	p.srv.Close()
	p.tr.CloseIdleConnections()
}

// countingBody counts an answer's bytes as received (compressed, if it is) and
// decompressed and, in a watch stream, its events.
type countingBody struct {
	io.ReadCloser
	p        *countingProxy
	resource string
	// tee receives the bytes: a goroutine decompresses them if needed and counts
	// them and a watch stream's events.
	tee *io.PipeWriter
}

// decode starts counting what the answer holds: its size decompressed, and in a
// watch stream the events (JSON events are one object per line; protobuf events
// are frames with a 4-byte length).
func (b *countingBody) decode(watch, protobuf, gzipped bool) {
	pr, pw := io.Pipe()
	b.tee = pw
	go func() {
		defer pr.Close()
		var r io.Reader = pr
		if gzipped {
			zr, err := gzip.NewReader(pr)
			if err != nil {
				return
			}
			r = zr
		}
		f := &frameCounter{protobuf: protobuf}
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			k := 0
			if watch {
				k = f.count(buf[:n])
			}
			b.p.mu.Lock()
			b.p.t.Raw[b.resource] += int64(n)
			b.p.t.Events[b.resource] += k
			b.p.mu.Unlock()
			if err != nil {
				io.Copy(io.Discard, pr) // never block the stream
				return
			}
		}
	}()
}

func (b *countingBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if n > 0 {
		b.p.mu.Lock()
		b.p.t.Bytes[b.resource] += int64(n)
		b.p.mu.Unlock()
		b.tee.Write(buf[:n])
	}
	return n, err
}

func (b *countingBody) Close() error {
	b.tee.Close()
	return b.ReadCloser.Close()
}

// frameCounter counts the events in a decompressed watch stream.
type frameCounter struct {
	protobuf bool
	// frameLeft is what remains of the current protobuf frame; lenBuf holds a
	// length prefix split across reads.
	frameLeft int
	lenBuf    []byte
}

func (f *frameCounter) count(data []byte) int {
	if !f.protobuf {
		return bytes.Count(data, []byte("\n"))
	}
	events := 0
	for len(data) > 0 {
		if f.frameLeft == 0 {
			take := min(4-len(f.lenBuf), len(data))
			f.lenBuf = append(f.lenBuf, data[:take]...)
			data = data[take:]
			if len(f.lenBuf) == 4 {
				f.frameLeft = int(binary.BigEndian.Uint32(f.lenBuf))
				f.lenBuf = f.lenBuf[:0]
				events++
			}
			continue
		}
		take := min(f.frameLeft, len(data))
		f.frameLeft -= take
		data = data[take:]
	}
	return events
}
