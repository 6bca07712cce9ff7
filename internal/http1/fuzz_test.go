package http1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// fuzzLimit is the body limit of the fuzzed reads: small, so that the fuzzer
// reaches it.
const fuzzLimit = 64

// sameAnswer fails when read and net/http's ReadResponse (skipping the 1xx
// answers, as read does) both accept answer and read another status or body.
func sameAnswer(t *testing.T, answer []byte) {
	t.Helper()
	got, err := read(bufio.NewReader(bytes.NewReader(answer)), fuzzLimit)
	if err != nil {
		return
	}
	if len(got.Body) > fuzzLimit {
		t.Fatalf("read %d bytes, over the limit %d", len(got.Body), fuzzLimit)
	}
	br := bufio.NewReader(bytes.NewReader(answer))
	var want *http.Response
	for {
		if want, err = http.ReadResponse(br, nil); err != nil {
			// read is more lenient here and there (HTTP/1.x, a Content-Length of
			// "+5"); that is no other reading of an answer net/http reads.
			return
		}
		if want.StatusCode >= 200 {
			break
		}
	}
	body, err := io.ReadAll(io.LimitReader(want.Body, fuzzLimit+1))
	if err != nil {
		return
	}
	if want.StatusCode != got.StatusCode || !bytes.Equal(body, got.Body) {
		t.Fatalf("%q: read reads %d %q; net/http reads %d %q", answer, got.StatusCode, got.Body, want.StatusCode, body)
	}
}

func FuzzReadAgreesWithNetHTTP(f *testing.F) {
	for _, a := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3;ext=1\r\nllo\r\n0\r\nX-Trailer: t\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nX: y\r\n\r\nto the end",
		"HTTP/1.0 204 No Content\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\na\r\n0\r\n\r\n",
	} {
		f.Add([]byte(a))
	}
	f.Fuzz(func(t *testing.T, answer []byte) { sameAnswer(t, answer) })
}
