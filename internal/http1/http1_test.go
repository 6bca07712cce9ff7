package http1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDoAgainstNetHTTPServer: the answers of a real net/http server, in each of the
// ways it frames a body, read back exactly, and what the server received.
func TestDoAgainstNetHTTPServer(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	var got struct {
		method, path, host, auth, conn, body string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.method, got.path, got.host, got.auth, got.body = r.Method, r.URL.Path, r.Host, r.Header.Get("Authorization"), string(b)
		got.conn = r.Header.Get("Connection")
		switch r.URL.Path {
		case "/length":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		case "/chunked": // flushed pieces: Transfer-Encoding chunked
			for _, p := range []string{"he", "llo", " world"} {
				io.WriteString(w, p)
				w.(http.Flusher).Flush()
			}
		case "/big": // over the server's buffer: chunked
			io.WriteString(w, big)
		case "/missing":
			http.Error(w, `{"reason":"NotFound"}`, http.StatusNotFound)
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	cases := []struct {
		name, method, path, body string
		limit                    int64
		wantCode                 int
		wantBody                 string
		wantErr                  error
	}{
		{name: "content-length", method: "GET", path: "/length", limit: 1 << 20, wantCode: 200, wantBody: "hello"},
		{name: "chunked", method: "GET", path: "/chunked", limit: 1 << 20, wantCode: 200, wantBody: "hello world"},
		{name: "large chunked", method: "GET", path: "/big", limit: 1 << 20, wantCode: 200, wantBody: big},
		{name: "not found", method: "GET", path: "/missing", limit: 1 << 20, wantCode: 404, wantBody: `{"reason":"NotFound"}` + "\n"},
		{name: "no content", method: "GET", path: "/empty", limit: 1 << 20, wantCode: 204},
		{name: "post with a body", method: "POST", path: "/length", body: `["a","b"]`, limit: 1 << 20, wantCode: 200, wantBody: "hello"},
		{name: "content-length over the limit", method: "GET", path: "/length", limit: 4, wantErr: ErrTooLarge},
		{name: "chunked over the limit", method: "GET", path: "/big", limit: 1 << 10, wantErr: ErrTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			req := Request{Method: c.method, Host: "example", Path: c.path, Header: [][2]string{{"Authorization", "Bearer t0k"}}}
			if c.body != "" {
				req.Body = []byte(c.body)
			}
			resp, err := Do(conn, req, c.limit)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("got %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.wantCode || string(resp.Body) != c.wantBody {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, shorten(resp.Body), c.wantCode, shorten([]byte(c.wantBody)))
			}
			want := struct{ method, path, host, auth, conn, body string }{c.method, c.path, "example", "Bearer t0k", "close", c.body}
			if diff := cmp.Diff(want, struct{ method, path, host, auth, conn, body string }(got), cmp.AllowUnexported(want)); diff != "" {
				t.Errorf("the server received (-want +got):\n%s", diff)
			}
		})
	}
}

func shorten(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// TestReadMalformedAnswers: answers that are cut short or not HTTP fail, never
// pass as a shorter body.
func TestReadMalformedAnswers(t *testing.T) {
	cases := []struct{ name, answer, want string }{
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", "malformed status line"},
		{"cut in the headers", "HTTP/1.1 200 OK\r\nContent-Le", "unexpected EOF"},
		{"body shorter than its length", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", "unexpected EOF"},
		{"chunked cut short", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "unexpected EOF"},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"},
		{"unknown transfer encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "not supported"},
		{"headers too long", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", MaxHeaderBytes) + "\r\n\r\n", "headers longer"},
		{"chunk size line too long", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;" + strings.Repeat("x", MaxChunkLineBytes) + "\r\nhello\r\n0\r\n\r\n",
			fmt.Sprintf("chunk size line longer than %d bytes", MaxChunkLineBytes)},
		{"chunked in an HTTP/1.0 answer", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "HTTP/1.0"},
		{"two different lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 11\r\n\r\nhello world", "two Content-Length headers"},
		{"a signed length", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", `Content-Length "+5"`},
		{"two transfer encodings", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\nhello", "more than one Transfer-Encoding"},
		{"folded header line", "HTTP/1.1 200 OK\r\nX-A: a\r\n Content-Length: 5\r\n\r\nhello world", "obs-fold"},
		{"chunk longer than its size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello world\r\n0\r\n\r\n", "chunk not followed by CRLF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := read(bufio.NewReader(strings.NewReader(c.answer)), 1<<20)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
	// A 100 Continue before the answer, and a body to the end of the connection.
	resp, err := read(bufio.NewReader(strings.NewReader("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX: y\r\n\r\nto the end")), 1<<20)
	if err != nil || resp.StatusCode != 200 || string(resp.Body) != "to the end" {
		t.Fatalf("got %+v, %v", resp, err)
	}
}

// TestManySmallChunksAreBoundedByTheBodyLimitOnly: the chunk-size lines and the
// CRLF after each chunk are framing, bounded line by line (MaxChunkLineBytes),
// not counted against the headers' MaxHeaderBytes: a 200 KiB answer in 16-byte
// chunks (about 12,800 chunk lines, 77 KiB of framing) is read whole, and only
// the body limit refuses it.
func TestManySmallChunksAreBoundedByTheBodyLimitOnly(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 200<<10/16)
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for i := 0; i < len(body); i += 16 {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", 16, body[i:i+16])
	}
	b.WriteString("0\r\nX-Trailer: t\r\n\r\n")
	resp, err := read(bufio.NewReader(strings.NewReader(b.String())), 16<<20)
	if err != nil {
		t.Fatalf("a %d-byte body in 16-byte chunks (limit %d): %v", len(body), 16<<20, err)
	}
	if string(resp.Body) != body {
		t.Fatalf("body %d bytes, want the %d sent", len(resp.Body), len(body))
	}
	if _, err := read(bufio.NewReader(strings.NewReader(b.String())), int64(len(body)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("with a limit 1 byte short of the body: %v, want %v", err, ErrTooLarge)
	}
}

// TestDoRefusesWhatWouldSplitTheRequest: a path, host or method holding a space or
// a line break is refused before anything is written.
func TestDoRefusesWhatWouldSplitTheRequest(t *testing.T) {
	for _, req := range []Request{
		{Method: "GET", Host: "h", Path: "/a b"},
		{Method: "GET", Host: "h", Path: "/a\r\nX-Injected: 1"},
		{Method: "GET", Host: "h\r\nX: y", Path: "/"},
		{Method: "GET /x", Host: "h", Path: "/"},
		{Method: "GET", Host: "h", Path: ""},
	} {
		client, server := net.Pipe()
		_, err := Do(client, req, 1<<10)
		client.Close()
		server.Close()
		if err == nil || !strings.Contains(err.Error(), "cannot be sent") {
			t.Errorf("Do(%+v) = %v, want a refusal", req, err)
		}
	}
}
