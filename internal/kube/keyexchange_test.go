package kube

import (
	"cmp"
	"crypto/tls"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

// handshake is what a TLS server saw of one handshake or one request's
// connection: its key exchange and whether it resumed a session.
type handshake struct {
	Curve   tls.CurveID
	Resumed bool
}

// exchangeServer is a TLS server (crypto/tls's, as the kube-apiserver's) that
// records every handshake it completes and the connection of every request it
// answers; configure may change its TLS config before it starts.
type exchangeServer struct {
	srv              *httptest.Server
	mu               sync.Mutex
	handshakes       []handshake
	requests         []handshake
	accepted, closed int // connections
}

func newExchangeServer(t *testing.T, configure func(*tls.Config)) (*exchangeServer, *Kubeconfig) {
	t.Helper()
	s := &exchangeServer{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, handshake{r.TLS.CurveID, r.TLS.DidResume})
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"metadata":{"name":"p","namespace":"n"}}`))
	}))
	s.srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, VerifyConnection: func(cs tls.ConnectionState) error {
		s.mu.Lock()
		s.handshakes = append(s.handshakes, handshake{cs.CurveID, cs.DidResume})
		s.mu.Unlock()
		return nil
	}}
	if configure != nil {
		configure(s.srv.TLS)
	}
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch st {
		case http.StateNew:
			s.accepted++
		case http.StateClosed, http.StateHijacked:
			s.closed++
		}
	}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
	return s, &Kubeconfig{Server: s.srv.URL, CAData: ca}
}

// seen returns, and forgets, what the server recorded since the last call, once
// the server has closed every connection it accepted (within 5 s): the client
// closes each of its connections, one that carries no request (a refused
// session's classical handshake) right after its handshake, which the server
// then finishes and records on its own time.
func (s *exchangeServer) seen() (handshakes, requests []handshake) {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		if s.closed == s.accepted || time.Now().After(deadline) {
			break
		}
		s.mu.Unlock()
	}
	defer s.mu.Unlock()
	handshakes, requests = s.handshakes, s.requests
	s.handshakes, s.requests = nil, nil
	return handshakes, requests
}

func (s *exchangeServer) check(t *testing.T, what string, wantHandshakes, wantRequests []handshake) {
	t.Helper()
	handshakes, requests := s.seen()
	// Two connections' handshakes may finish on the server in either order.
	byCurve := func(a, b handshake) int {
		return cmp.Or(cmp.Compare(a.Curve, b.Curve), cmp.Compare(boolInt(a.Resumed), boolInt(b.Resumed)))
	}
	slices.SortFunc(handshakes, byCurve)
	wantHandshakes = slices.SortedFunc(slices.Values(wantHandshakes), byCurve)
	if diff := gocmp.Diff(wantHandshakes, handshakes); diff != "" {
		t.Errorf("%s: the server's handshakes (-want +got):\n%s", what, diff)
	}
	if diff := gocmp.Diff(wantRequests, requests); diff != "" {
		t.Errorf("%s: the connections the server's requests came on (-want +got):\n%s", what, diff)
	}
}

var (
	fullHybrid      = handshake{tls.X25519MLKEM768, false}
	resumedX25519   = handshake{tls.X25519, true}
	fullX25519      = handshake{tls.X25519, false}
	resumedHybrid   = handshake{tls.X25519MLKEM768, true}
	resumedP256     = handshake{tls.CurveP256, true}
	noHandshakeLeft = []handshake(nil)
)

// A full handshake uses Go's default, post-quantum key exchange; a process that
// resumes the session it stored offers X25519 alone, and resumes.
func TestAResumedHandshakeOffersX25519AndAFullOneTheHybrid(t *testing.T) {
	s, kc := newExchangeServer(t, nil)
	path := filepath.Join(t.TempDir(), "session")
	getResumed(t, kc, path)
	s.check(t, "first GET", []handshake{fullHybrid}, []handshake{fullHybrid})
	for _, what := range []string{"second GET", "third GET"} {
		if resumed, _ := getResumed(t, kc, path); !resumed {
			t.Errorf("%s: not resumed", what)
		}
		s.check(t, what, []handshake{resumedX25519}, []handshake{resumedX25519})
	}
}

// When the server no longer resumes the stored session (its ticket keys changed,
// as when the API server restarts), the handshake that offered it has become a
// full one with a classical key exchange: no request goes over it. The request
// goes over a full handshake with the hybrid exchange, whose session is stored;
// the next processes resume it with the hybrid exchange for ClassicalPause, then
// with X25519 again.
func TestARefusedSessionsClassicalHandshakeCarriesNoRequest(t *testing.T) {
	now := time.Now()
	setNow(t, &now)
	s, kc := newExchangeServer(t, nil)
	path := filepath.Join(t.TempDir(), "session")
	getResumed(t, kc, path)
	s.seen()
	s.srv.TLS.SetSessionTicketKeys([][32]byte{{1, 2, 3}})
	if resumed, err := getResumed(t, kc, path); resumed || err != nil {
		t.Errorf("after the server's new ticket keys: resumed %v, store error %v; want a full handshake, stored", resumed, err)
	}
	s.check(t, "GET after the server's new ticket keys", []handshake{fullX25519, fullHybrid}, []handshake{fullHybrid})
	now = now.Add(ClassicalPause - time.Second)
	if resumed, _ := getResumed(t, kc, path); !resumed {
		t.Error("the next GET did not resume the session of the hybrid handshake")
	}
	s.check(t, "a GET within ClassicalPause of the refusal", []handshake{resumedHybrid}, []handshake{resumedHybrid})
	now = now.Add(time.Second)
	if resumed, _ := getResumed(t, kc, path); !resumed {
		t.Error("the GET after ClassicalPause did not resume")
	}
	s.check(t, "a GET ClassicalPause after the refusal", []handshake{resumedX25519}, []handshake{resumedX25519})

	// A refusal dated in the future (the clock set back since) does not hold the
	// classical exchange back until the clock catches up.
	s.srv.TLS.SetSessionTicketKeys([][32]byte{{4, 5, 6}})
	getResumed(t, kc, path)
	s.check(t, "GET after the server's second new ticket keys", []handshake{fullX25519, fullHybrid}, []handshake{fullHybrid})
	now = now.Add(-24 * time.Hour)
	if resumed, _ := getResumed(t, kc, path); !resumed {
		t.Error("the GET with the clock set back did not resume")
	}
	s.check(t, "a GET with the clock set back a day", []handshake{resumedX25519}, []handshake{resumedX25519})
}

// Several API servers behind one address, each with its own ticket keys: a
// session made with one is refused by the others. After the first refusal, the
// processes of the next ClassicalPause offer their session with the hybrid
// exchange, so a refused one costs no second handshake.
func TestSeveralServersCostOneClassicalRefusalAPause(t *testing.T) {
	now := time.Now()
	setNow(t, &now)
	s, kc := newExchangeServer(t, nil)
	path := filepath.Join(t.TempDir(), "session")
	keys := [][32]byte{{1}, {2}, {3}}
	classicalFull := 0
	for i := range 12 {
		s.srv.TLS.SetSessionTicketKeys([][32]byte{keys[i%len(keys)]}) // the next server
		getResumed(t, kc, path)
		handshakes, requests := s.seen()
		for _, h := range handshakes {
			if h == fullX25519 {
				classicalFull++
			}
		}
		if len(requests) != 1 || requests[0].Curve != tls.X25519MLKEM768 {
			t.Errorf("GET %d: the request came on %v, want one connection with the hybrid exchange (resumed or full)", i+1, requests)
		}
		now = now.Add(time.Minute)
	}
	// GET 2 is refused; GET 12 comes 11 minutes after GET 1, the pause over.
	if classicalFull != 2 {
		t.Errorf("%d classical full handshakes in 12 GETs over 11 minutes, want 2 (one a ClassicalPause)", classicalFull)
	}
}

// setNow makes the session file's clock *now for the test.
func setNow(t *testing.T, now *time.Time) {
	t.Helper()
	old := timeNow
	timeNow = func() time.Time { return *now }
	t.Cleanup(func() { timeNow = old })
}

// A server without X25519 (a FIPS build's) resumes with P-256; one with the
// hybrid exchange alone fails the classical handshake, and the connection is made
// again with the default exchanges, the session still offered.
func TestAResumptionWithoutX25519(t *testing.T) {
	for _, tc := range []struct {
		name   string
		curves []tls.CurveID
		want   []handshake
		wantRq []handshake
	}{
		{"P-256 only", []tls.CurveID{tls.CurveP256}, []handshake{resumedP256}, []handshake{resumedP256}},
		{"hybrid only", []tls.CurveID{tls.X25519MLKEM768}, noHandshakeLeft, []handshake{resumedHybrid}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, kc := newExchangeServer(t, func(c *tls.Config) { c.CurvePreferences = tc.curves })
			path := filepath.Join(t.TempDir(), "session")
			getResumed(t, kc, path)
			s.seen()
			if resumed, _ := getResumed(t, kc, path); !resumed {
				t.Error("not resumed")
			}
			want := tc.want
			if want == nil {
				// The failed classical handshake is not completed on the server.
				want = []handshake{resumedHybrid}
			}
			s.check(t, "second GET", want, tc.wantRq)
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
