package kube

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// TestTLSServerNameIsWhatTheCertificateIsCheckedAgainst: a cluster's
// tls-server-name, when set, is the name the server's certificate must hold
// (and the SNI sent), as for kubectl; else the server URL's host is. The
// httptest certificate holds example.com, 127.0.0.1 and ::1.
func TestTLSServerNameIsWhatTheCertificateIsCheckedAgainst(t *testing.T) {
	var sni []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sni = append(sni, r.TLS.ServerName)
		w.Write([]byte(`{"metadata":{"name":"p","namespace":"n"}}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	t.Cleanup(srv.Close)
	if !strings.HasPrefix(srv.URL, "https://127.0.0.1:") {
		t.Fatalf("the test server is at %s, not 127.0.0.1: the cases assume it", srv.URL)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for _, tc := range []struct {
		name, serverName string
		wantSNI          string
		wantErr          []string
	}{
		{"none: the URL's host", "", "", nil}, // no SNI for an IP address
		{"a name the certificate holds", "example.com", "example.com", nil},
		{"a name the certificate does not hold, though it holds the URL's host", "api.other.example", "",
			[]string{"certificate is valid for", "not api.other.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sni = nil
			c, err := NewClient(&Kubeconfig{Server: srv.URL, CAData: ca, TLSServerName: tc.serverName}, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var pod Pod
			err = c.Get(context.Background(), "/api/v1/namespaces/n/pods/p", &pod)
			if tc.wantErr != nil {
				wanterr.Mentions(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(sni) != 1 || sni[0] != tc.wantSNI {
				t.Errorf("the server saw SNI %q, want [%q]", sni, tc.wantSNI)
			}
		})
	}
}

// TestTheTokenFileIsPreferredToTheInlineToken: with tokenFile set, the client
// sends the file's token (a rotated one, where the inline token may be stale),
// and the inline token only when the file gives none, as client-go does; a token
// file that gives none with no inline token is refused naming the file, not
// sent anonymous.
func TestTheTokenFileIsPreferredToTheInlineToken(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.Write([]byte(`{"metadata":{"name":"p","namespace":"n"}}`))
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	fresh, empty, blank, missing := filepath.Join(dir, "fresh"), filepath.Join(dir, "empty"), filepath.Join(dir, "blank"), filepath.Join(dir, "missing")
	for path, data := range map[string]string{fresh: "fresh-token\n", empty: "", blank: " \n"} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, token, tokenFile string
		want                   string // the Authorization header sent
		wantErr                []string
	}{
		{"an inline token", "inline", "", "Bearer inline", nil},
		{"a token file, trimmed", "", fresh, "Bearer fresh-token", nil},
		{"both: the file's", "stale", fresh, "Bearer fresh-token", nil},
		{"both, the file empty: the inline token", "stale", empty, "Bearer stale", nil},
		{"both, the file missing: the inline token", "stale", missing, "Bearer stale", nil},
		{"neither: anonymous, as the kubeconfig says", "", "", "", nil},
		{"an empty token file alone", "", empty, "", []string{"tokenFile", empty, "is empty"}},
		{"a blank token file alone", "", blank, "", []string{"tokenFile", blank, "is empty"}},
		{"a missing token file alone", "", missing, "", []string{"tokenFile", missing, "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			c, err := NewClient(&Kubeconfig{Server: srv.URL, Token: tc.token, TokenFile: tc.tokenFile}, 5*time.Second)
			if tc.wantErr != nil {
				wanterr.Mentions(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var pod Pod
			if err := c.Get(context.Background(), "/api/v1/namespaces/n/pods/p", &pod); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("Authorization sent (-want +got):\n%s", diff)
			}
		})
	}
}
