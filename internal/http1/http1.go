// Package http1 is the plugin's HTTP client: one HTTP/1.1 request per connection,
// written and read directly on a net.Conn.
//
// The plugin is exec'd once per pod and asks at most a few questions (the agent's pod
// cache, the API server, Istio's agent's log socket). net/http would cost it on every
// exec, the ADDs that make no request included: its package initialisation and that
// of what it links (HTTP/2, compression, IDNA tables, proxy settings) and a larger
// binary to load, and on a request an http.Transport's pool and per-connection
// goroutines. This package is what those requests need and nothing else: no
// keep-alive, no redirects, no proxies, no compression, no HTTP/2.
package http1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// Request is one request: Method, the Host header, Path (already escaped) and the
// extra Header lines (name, value); Body, when not nil, is sent with its length.
type Request struct {
	Method string
	Host   string
	Path   string
	Header [][2]string
	Body   []byte
}

// Response is the answer: the status code and the whole body.
type Response struct {
	StatusCode int
	Body       []byte
}

// MaxHeaderBytes bounds the status line and headers of an answer (with the
// trailer fields of a chunked body, which are headers too).
const MaxHeaderBytes = 64 << 10

// MaxChunkLineBytes bounds each chunk-size line of a chunked body (the size, any
// extensions, the CRLF). The chunk lines are framing, not headers: each has its
// own bound, however many chunks there are, and the body they frame is bounded by
// the caller's limit only.
const MaxChunkLineBytes = 4 << 10

// ErrTooLarge is returned when an answer's body exceeds the caller's limit.
var ErrTooLarge = errors.New("answer larger than the limit")

// Do writes req on conn, asking the server to close the connection after it, and
// reads the answer, whose body may be at most limit bytes (ErrTooLarge). The
// caller owns conn (its deadline bounds the exchange) and closes it.
func Do(conn net.Conn, req Request, limit int64) (*Response, error) {
	if req.Path == "" || strings.ContainsAny(req.Path, " \r\n") || strings.ContainsAny(req.Host, " \r\n") || strings.ContainsAny(req.Method, " \r\n") {
		return nil, fmt.Errorf("request %q %q to host %q: a method, path or host that cannot be sent", req.Method, req.Path, req.Host)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", req.Method, req.Path, req.Host)
	for _, h := range req.Header {
		if strings.ContainsAny(h[0], "\r\n:") || strings.ContainsAny(h[1], "\r\n") {
			return nil, fmt.Errorf("header %q: invalid name or value", h[0])
		}
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
	}
	if req.Body != nil {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(req.Body))
	}
	b.WriteString("\r\n")
	b.Write(req.Body)
	if _, err := conn.Write(b.Bytes()); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	return read(bufio.NewReader(conn), limit)
}

// read reads one answer: the status line, the headers, and the body by its
// Content-Length, chunked, or up to the end of the connection.
func read(r *bufio.Reader, limit int64) (*Response, error) {
	hr := &headerReader{r: r, left: MaxHeaderBytes}
	var resp Response
	var length int64 = -1
	chunked, sawEncoding := false, false
	for {
		line, err := hr.line()
		if err != nil {
			return nil, fmt.Errorf("read answer: %w", err)
		}
		// 1xx answers (100 Continue) come before the real one: skip them.
		proto, rest, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(proto, "HTTP/1.") || len(rest) < 3 {
			return nil, fmt.Errorf("read answer: malformed status line %q", line)
		}
		resp.StatusCode, err = strconv.Atoi(rest[:3])
		if err != nil || resp.StatusCode < 100 {
			return nil, fmt.Errorf("read answer: malformed status line %q", line)
		}
		for {
			h, err := hr.line()
			if err != nil {
				return nil, fmt.Errorf("read answer headers: %w", err)
			}
			if h == "" {
				break
			}
			if h[0] == ' ' || h[0] == '\t' {
				// obs-fold (RFC 9112, 5.2): the line continues the previous
				// field's value, as net/http reads it; read as a field of its
				// own (" Content-Length: 5"), it would frame the body otherwise.
				return nil, fmt.Errorf("read answer: a header line folded onto the previous one (obs-fold) is not supported")
			}
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				return nil, fmt.Errorf("read answer: malformed header %q", h)
			}
			value = strings.TrimSpace(value)
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "content-length":
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil || n < 0 || value[0] == '+' {
					return nil, fmt.Errorf("read answer: Content-Length %q", value)
				}
				if length >= 0 && n != length {
					// Two lengths: which frames the body is what request smuggling
					// plays on; net/http refuses it too.
					return nil, fmt.Errorf("read answer: two Content-Length headers, %d and %d", length, n)
				}
				length = n
			case "transfer-encoding":
				if sawEncoding {
					return nil, fmt.Errorf("read answer: more than one Transfer-Encoding header")
				}
				sawEncoding = true
				chunked = strings.EqualFold(value, "chunked")
				if !chunked && !strings.EqualFold(value, "identity") {
					return nil, fmt.Errorf("read answer: Transfer-Encoding %q not supported", value)
				}
			}
		}
		if resp.StatusCode >= 200 {
			if chunked && proto == "HTTP/1.0" {
				// Transfer-Encoding came with HTTP/1.1: in an HTTP/1.0 answer it is
				// faulty framing (RFC 9112, 6.1), which net/http reads as a raw body.
				return nil, fmt.Errorf("read answer: Transfer-Encoding in an HTTP/1.0 answer")
			}
			break
		}
		length, chunked, sawEncoding = -1, false, false
	}
	var body io.Reader
	switch {
	case resp.StatusCode == 204 || resp.StatusCode == 304:
		return &resp, nil
	case chunked:
		body = &chunkReader{r: r, hr: hr}
	case length >= 0:
		if length > limit {
			return nil, fmt.Errorf("read answer: %w (Content-Length %d, limit %d)", ErrTooLarge, length, limit)
		}
		body = io.LimitReader(r, length)
	default:
		body = r // to the end of the connection
	}
	var err error
	resp.Body, err = io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read answer body: %w", err)
	}
	if int64(len(resp.Body)) > limit {
		return nil, fmt.Errorf("read answer: %w (%d bytes)", ErrTooLarge, limit)
	}
	if length >= 0 && !chunked && int64(len(resp.Body)) < length {
		return nil, fmt.Errorf("read answer body: %w (%d of %d bytes)", io.ErrUnexpectedEOF, len(resp.Body), length)
	}
	return &resp, nil
}

// headerReader reads CRLF (or LF) terminated lines, at most left bytes in all.
type headerReader struct {
	r    *bufio.Reader
	left int
}

func (h *headerReader) line() (string, error) {
	line, n, err := readLine(h.r, h.left)
	h.left -= n
	if err == errLineTooLong {
		return "", fmt.Errorf("headers longer than %d bytes", MaxHeaderBytes)
	}
	return line, err
}

// errLineTooLong is readLine's error for a line longer than its bound.
var errLineTooLong = errors.New("line too long")

// readLine reads a CRLF (or LF) terminated line of at most max bytes, its
// terminator included, and returns it without the terminator and the bytes read;
// a longer line is errLineTooLong, read no further than max bytes and a buffer.
func readLine(r *bufio.Reader, max int) (string, int, error) {
	var line []byte
	n := 0
	for {
		frag, err := r.ReadSlice('\n')
		if n += len(frag); n > max {
			return "", n, errLineTooLong
		}
		line = append(line, frag...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", n, err
		}
	}
	return strings.TrimRight(string(line), "\r\n"), n, nil
}

// chunkReader decodes a chunked body (RFC 9112, 7.1); trailers are read and dropped.
// Each chunk-size line is bounded by MaxChunkLineBytes, the CRLF after a chunk's
// data must be just that, and the trailers count against what is left of the
// headers' MaxHeaderBytes (hr).
type chunkReader struct {
	r    *bufio.Reader
	hr   *headerReader
	left int64 // bytes left in the current chunk
	done bool
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		line, _, err := readLine(c.r, MaxChunkLineBytes)
		if err == errLineTooLong {
			return 0, fmt.Errorf("chunk size line longer than %d bytes", MaxChunkLineBytes)
		}
		if err != nil {
			return 0, fmt.Errorf("chunk size: %w", err)
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("chunk size %q", line)
		}
		if n == 0 {
			for { // trailers, up to the empty line
				t, err := c.hr.line()
				if err != nil {
					return 0, fmt.Errorf("chunk trailer: %w", err)
				}
				if t == "" {
					break
				}
			}
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		if crlf, _, err := readLine(c.r, len("\r\n")); err != nil || crlf != "" {
			return n, fmt.Errorf("chunk not followed by CRLF")
		}
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
