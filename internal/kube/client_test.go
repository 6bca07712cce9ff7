package kube

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
