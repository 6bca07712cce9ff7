package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// sessionServer is a TLS server (crypto/tls's, with its session tickets, as the
// kube-apiserver's) answering every GET with an empty JSON object, and a
// kubeconfig that trusts it.
func sessionServer(t *testing.T) *Kubeconfig {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"metadata":{"name":"p","namespace":"n"}}`))
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &Kubeconfig{Server: srv.URL, CAData: ca}
}

// getResumed runs one GET with a new client (as a new plugin process would) that
// keeps its session at path, and says whether it resumed one.
func getResumed(t *testing.T, kc *Kubeconfig, path string) (resumed bool, saveErr error) {
	t.Helper()
	c, err := NewClient(kc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.ResumeSessions(path, kc)
	var pod Pod
	if err := c.Get(context.Background(), "/api/v1/namespaces/n/pods/p", &pod); err != nil {
		t.Fatalf("GET: %v", err)
	}
	return c.Resumed()
}

func TestASecondClientResumesTheStoredSession(t *testing.T) {
	kc := sessionServer(t)
	path := filepath.Join(t.TempDir(), "session")
	for i, want := range []bool{false, true, true} {
		resumed, err := getResumed(t, kc, path)
		if err != nil {
			t.Fatalf("GET %d: storing the session: %v", i+1, err)
		}
		if resumed != want {
			t.Errorf("GET %d: resumed = %v, want %v", i+1, resumed, want)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("session file mode %v, want 0600: it holds the session's secret", mode)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("the directory holds %d files, want the session file alone (no temporary file left)", len(entries))
	}
}

func TestASessionIsOfferedOnlyUnderItsOwnKubeconfig(t *testing.T) {
	kc := sessionServer(t)
	path := filepath.Join(t.TempDir(), "session")
	if _, err := getResumed(t, kc, path); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The same server and CA, but another client certificate in the kubeconfig:
	// the session is not offered (it would authenticate as the other one).
	other := *kc
	other.ClientCertData = []byte("another client")
	if _, ok := NewSessionFile(path, &other, "127.0.0.1").Get(""); ok {
		t.Error("a session stored under one kubeconfig is offered under another client certificate")
	}
	for _, change := range []struct {
		what string
		do   func(k *Kubeconfig)
	}{
		{"another CA", func(k *Kubeconfig) { k.CAData = append(bytes.Clone(k.CAData), '\n') }},
		{"another server URL", func(k *Kubeconfig) { k.Server += "/" }},
		{"verification turned off", func(k *Kubeconfig) { k.InsecureSkipTLSVerify = true }},
	} {
		k := *kc
		change.do(&k)
		if _, ok := NewSessionFile(path, &k, "127.0.0.1").Get(""); ok {
			t.Errorf("a session is offered under a kubeconfig with %s", change.what)
		}
	}
	if _, ok := NewSessionFile(path, kc, "127.0.0.1").Get(""); !ok {
		t.Error("the session is not offered under its own kubeconfig")
	}
	if _, ok := NewSessionFile(path, kc, "localhost").Get(""); ok {
		t.Error("the session is offered for another server name")
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, stored) {
		t.Error("offering (or not) changed the file")
	}
}

func TestABadSessionFileMeansAFullHandshakeAndIsReplaced(t *testing.T) {
	kc := sessionServer(t)
	good := filepath.Join(t.TempDir(), "good")
	if _, err := getResumed(t, kc, good); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"not ours", []byte("hello\n")},
		{"magic only", []byte(sessionMagic)},
		{"truncated ticket", stored[:len(sessionMagic)+32+4]},
		{"corrupt state", append(bytes.Clone(stored[:len(stored)-40]), bytes.Repeat([]byte{0xff}, 40)...)},
		{"over the bound", append(bytes.Clone(stored), make([]byte, MaxSessionFileBytes)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "session")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			resumed, err := getResumed(t, kc, path)
			if err != nil {
				t.Fatalf("storing the session: %v", err)
			}
			if resumed {
				t.Fatal("resumed from a bad file")
			}
			if resumed, _ := getResumed(t, kc, path); !resumed {
				t.Error("the bad file was not replaced by a session the next client resumes")
			}
		})
	}
}

func TestAnUnwritableSessionFileDoesNotFailTheGet(t *testing.T) {
	kc := sessionServer(t)
	path := filepath.Join(t.TempDir(), "missing-dir", "session")
	resumed, err := getResumed(t, kc, path)
	if resumed || err == nil {
		t.Errorf("resumed %v, store error %v; want a full handshake and the error", resumed, err)
	}
}

func TestAVoidedSessionIsRemoved(t *testing.T) {
	kc := sessionServer(t)
	path := filepath.Join(t.TempDir(), "session")
	if _, err := getResumed(t, kc, path); err != nil {
		t.Fatal(err)
	}
	// crypto/tls puts nil when it drops the session it was offered (the server's
	// certificate in it has expired) and no new one comes.
	s := NewSessionFile(path, kc, "127.0.0.1")
	if _, ok := s.Get(""); !ok {
		t.Fatal("no session stored")
	}
	s.Put("", nil)
	if err := s.Save(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the voided session's file is still there (%v)", err)
	}
}

// TestASessionIsNotResumedUnderAnotherTLSServerName: tls-server-name is part of
// the session file's binding (the name the stored session's certificate was
// checked against), as the URL's host is without it.
func TestASessionIsNotResumedUnderAnotherTLSServerName(t *testing.T) {
	kc := sessionServer(t)
	path := filepath.Join(t.TempDir(), "session")
	if _, err := getResumed(t, kc, path); err != nil {
		t.Fatal(err)
	}
	named := *kc
	named.TLSServerName = "example.com" // the httptest certificate holds it
	for i, want := range []bool{false, true} {
		resumed, err := getResumed(t, &named, path)
		if err != nil {
			t.Fatal(err)
		}
		if resumed != want {
			t.Errorf("GET %d with tls-server-name example.com after a session made without: resumed = %v, want %v", i+1, resumed, want)
		}
	}
}
