package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/istio-cni/istio-cni/test/harness/logbuf"
)

// TestTokenRenewalFollowsTheTokensOwnLifetime: renewal comes at half the token's
// lifetime by its own claims, whatever the node's clock says of its expiry, and
// never sooner than tokenRenewMin: a node clock ahead of the API server's made the
// wait zero or negative, a tight loop of TokenRequests and kubeconfig rewrites.
func TestTokenRenewalFollowsTheTokensOwnLifetime(t *testing.T) {
	now := time.Unix(2_000_000_000, 0)
	jwt := func(iat, exp int64) []byte {
		payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"aud":["x"],"exp":%d,"iat":%d,"sub":"system:serviceaccount:istio-system:istio-cni-plugin"}`, exp, iat))
		return []byte("eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln")
	}
	server := now.Unix() // the API server's clock, when it agrees with the node's
	cases := []struct {
		name    string
		token   []byte
		expires time.Time
		want    time.Duration
	}{
		{"clocks agree", jwt(server, server+86400), now.Add(24 * time.Hour), 12 * time.Hour},
		{"node clock 2 h ahead, token of 1 h", jwt(server-7200, server-7200+3600), now.Add(-time.Hour), 30 * time.Minute},
		{"node clock 2 h behind, token of 1 h", jwt(server+7200, server+7200+3600), now.Add(3 * time.Hour), 30 * time.Minute},
		{"no claims: half of what is left", []byte("opaque"), now.Add(2 * time.Hour), time.Hour},
		{"no claims, expiry already past", []byte("opaque"), now.Add(-time.Minute), tokenRenewMin},
		{"no claims, no expiry", []byte("a.b.c"), time.Time{}, tokenRenewMin},
		{"claims without iat", []byte("h." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":5}`)) + ".s"), now.Add(20 * time.Minute), 10 * time.Minute},
		{"exp before iat", jwt(server, server-10), now.Add(20 * time.Minute), 10 * time.Minute},
	}
	for _, c := range cases {
		if got := renewIn(c.token, c.expires, now); got != c.want {
			t.Errorf("%s: renewIn = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestTheRenewalWaitCountsTimeTheNodeWasSuspended: Go's timers run on the monotonic
// clock, which stands still while the node is suspended or hibernated, while the
// token expires by the wall clock. A node suspended for longer than the rest of the
// wait comes back past its renewal time by the wall clock: the wait ends at its next
// look at the wall clock, instead of the whole monotonic wait later (a token of 24 h
// renewed after 6 h, a night's suspend, then 6 more hours: 2 h after it expired).
func TestTheRenewalWaitCountsTimeTheNodeWasSuspended(t *testing.T) {
	// A wall clock 2 h on: this reads it without a monotonic reading, as a resumed
	// node's wall clock is ahead of its monotonic one.
	suspended := func() time.Time { return time.Now().Round(0).Add(2 * time.Hour) }
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if !untilDue(ctx, time.Now().Add(time.Hour), suspended, 10*time.Millisecond) {
		t.Fatalf("a renewal due in 1 h by the monotonic clock and past by the wall clock: still waiting after %s", time.Since(start).Round(time.Millisecond))
	}

	// Awake, the wait is the monotonic one, and the context ends it.
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if untilDue(ctx, time.Now().Add(time.Hour), time.Now, 10*time.Millisecond) {
		t.Error("a renewal due in 1 h came within 100 ms")
	}
	start = time.Now()
	if !untilDue(t.Context(), time.Now().Add(50*time.Millisecond), time.Now, time.Minute) || time.Since(start) < 50*time.Millisecond {
		t.Errorf("a renewal due in 50 ms came after %s", time.Since(start))
	}
}

// TestWaitingForThePluginsFirstTokenIsNoInstallFailure: the first reconcile of
// every start runs while the token source's first TokenRequest is still in flight
// (the features start a moment before). That is a wait, as for the primary's
// config, not a failed install step: the agent stays not ready and says it waits,
// without an error line or a CREATE_KUBECONFIG_FAILURE count on every start. A
// request that failed is a failed step, logged and counted; once the token is in,
// the kubeconfig carries it.
func TestWaitingForThePluginsFirstTokenIsNoInstallFailure(t *testing.T) {
	sa := t.TempDir()
	writeFile(t, filepath.Join(sa, "token"), []byte("agent-token"), 0o600)
	writeFile(t, filepath.Join(sa, "ca.crt"), testCA(t), 0o644)
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa, "PLUGIN_SERVICE_ACCOUNT": "istio-cni-plugin", "POD_NAMESPACE": "istio-system"})
	s.RunDir = t.TempDir()
	var log bytes.Buffer
	a := newAgent(&s, slog.New(slog.NewTextHandler(&log, nil)))
	a.tokens = newTokenSource(nil, &s, a.log) // its first request not answered yet
	failures := func() string {
		return `istio_cni_installs_total{result="` + installKubeconfigFailed + `"} `
	}

	a.reconcile(dirtyKubeconfig)
	if a.kubeOK || a.ready.Load() {
		t.Error("ready without the plugin's token")
	}
	if strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("waiting for the first token is logged as an error:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "waiting for the plugin's token") {
		t.Errorf("the log does not say the agent waits for the plugin's token:\n%s", log.String())
	}
	if m := gatherText(t, a.m); !strings.Contains(string(m), failures()+"0") {
		t.Errorf("waiting for the first token counted as a failed install step:\n%s", istioCNISeries(m))
	}

	a.tokens.mu.Lock()
	a.tokens.failure = errors.New("serviceaccounts \"istio-cni-plugin\" is forbidden")
	a.tokens.mu.Unlock()
	a.reconcile(dirtyKubeconfig)
	if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), "is forbidden") {
		t.Errorf("a failed TokenRequest is not logged as a failed step, naming the failure:\n%s", log.String())
	}
	if m := gatherText(t, a.m); !strings.Contains(string(m), failures()+"1") {
		t.Errorf("a failed TokenRequest is not counted once:\n%s", istioCNISeries(m))
	}

	a.tokens.mu.Lock()
	a.tokens.cur, a.tokens.failure = &pluginToken{token: []byte("plugin-token"), expires: time.Now().Add(time.Hour)}, nil
	a.tokens.mu.Unlock()
	a.reconcile(dirtyKubeconfig)
	if !a.kubeOK {
		t.Errorf("the kubeconfig step is not done once the token is in:\n%s", log.String())
	}
	if kc, err := os.ReadFile(s.KubeconfigPath()); err != nil || !strings.Contains(string(kc), "plugin-token") {
		t.Errorf("the kubeconfig does not carry the plugin's token: %v\n%s", err, kc)
	}
}

// TestWithNoKubeconfigYetNoHintClaimsAPreviousOne: on a node where no agent wrote
// the plugin's kubeconfig yet (a first install), waiting for the plugin's token
// and a failed TokenRequest are logged without "the plugin keeps the previous
// kubeconfig": there is none; with one in place the hint says it is kept.
func TestWithNoKubeconfigYetNoHintClaimsAPreviousOne(t *testing.T) {
	for _, tc := range []struct {
		name     string
		previous bool
	}{
		{"first install", false},
		{"a previous agent's kubeconfig", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa := t.TempDir()
			writeFile(t, filepath.Join(sa, "token"), []byte("agent-token"), 0o600)
			writeFile(t, filepath.Join(sa, "ca.crt"), testCA(t), 0o644)
			s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa, "PLUGIN_SERVICE_ACCOUNT": "istio-cni-plugin", "POD_NAMESPACE": "istio-system"})
			s.RunDir = t.TempDir()
			if tc.previous {
				writeFile(t, s.KubeconfigPath(), []byte("# a previous agent's\n"), 0o600)
			}
			var log bytes.Buffer
			a := newAgent(&s, slog.New(slog.NewTextHandler(&log, nil)))
			a.tokens = newTokenSource(nil, &s, a.log)
			a.reconcile(dirtyKubeconfig) // waiting for the first token
			a.tokens.mu.Lock()
			a.tokens.failure = errors.New("serviceaccounts \"istio-cni-plugin\" is forbidden")
			a.tokens.mu.Unlock()
			a.reconcile(dirtyKubeconfig) // the request failed
			if got := strings.Count(log.String(), "keeps the previous kubeconfig"); tc.previous && got != 2 || !tc.previous && got != 0 {
				t.Errorf("%d lines say the plugin keeps the previous kubeconfig (one in place: %v):\n%s", got, tc.previous, log.String())
			}
		})
	}
}

// TestAFailedTokenRequestClaimsNoTokenItDoesNotHave: a TokenRequest that fails
// before this agent has a token says only that it failed (on a first install no
// kubeconfig is in place; the install step's hint says what is); one that fails to
// renew a token says the kubeconfig keeps that token, and until when. Every
// failure said "the plugin's kubeconfig keeps its current token".
func TestAFailedTokenRequestClaimsNoTokenItDoesNotHave(t *testing.T) {
	for _, tc := range []struct {
		name string
		cur  *pluginToken
		want string
		not  string
	}{
		{"first request", nil, "plugin token request failed", "keeps"},
		{"renewal", &pluginToken{token: []byte("t"), expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)},
			"plugin token renewal failed; the plugin's kubeconfig keeps the current token until it expires", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("serviceaccounts \"istio-cni-plugin\" is forbidden")
			})
			s := Settings{PodNamespace: "istio-system", PluginServiceAccount: "istio-cni-plugin", NodeName: "node-a", PluginTokenLifetime: time.Hour}
			var log logbuf.Buffer
			ts := newTokenSource(client.CoreV1(), &s, slog.New(slog.NewTextHandler(&log, nil)))
			ts.cur = tc.cur
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); ts.run(ctx) }()
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(log.String(), "is forbidden") && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			<-done
			got := log.String()
			if !strings.Contains(got, tc.want) {
				t.Errorf("the failure's line lacks %q:\n%s", tc.want, got)
			}
			if tc.not != "" && strings.Contains(got, tc.not) {
				t.Errorf("the failure's line claims the kubeconfig %s a token this agent never had:\n%s", tc.not, got)
			}
			if tc.cur != nil && !strings.Contains(got, "expires=2030-01-02T03:04:05Z") {
				t.Errorf("the renewal failure does not say when the kept token expires:\n%s", got)
			}
		})
	}
}

// TestTheTokensExpiryAndFailuresAreMetrics: the plugin keeps working on its token for
// half its lifetime with no renewal, so an operator alerts before it runs out: the
// current token's expiry is a gauge (istio_cni_plugin_token_expiry_timestamp_seconds),
// and every failed TokenRequest is counted
// (istio_cni_plugin_token_request_failures_total). Until then a renewal that kept
// failing showed only in the log.
func TestTheTokensExpiryAndFailuresAreMetrics(t *testing.T) {
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		fail       bool
		wantExpiry float64
	}{
		{"issued", false, float64(expires.Unix())},
		{"refused", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
				if tc.fail {
					return true, nil, errors.New("serviceaccounts \"istio-cni-plugin\" is forbidden")
				}
				return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{
					Token: "plugin-token", ExpirationTimestamp: metav1.NewTime(expires)}}, nil
			})
			s := Settings{PodNamespace: "istio-system", PluginServiceAccount: "istio-cni-plugin", NodeName: "node-a", PluginTokenLifetime: time.Hour}
			ts := newTokenSource(client.CoreV1(), &s, slog.New(slog.DiscardHandler))
			ts.m = newMetrics()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); ts.run(ctx) }()
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if tok, failure := ts.current(); tok != nil || failure != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			<-done
			if got := gathered(t, ts.m, "istio_cni_plugin_token_expiry_timestamp_seconds", "", ""); got != tc.wantExpiry {
				t.Errorf("token expiry gauge %v, want %v", got, tc.wantExpiry)
			}
			if got, want := gathered(t, ts.m, "istio_cni_plugin_token_request_failures_total", "", ""), map[bool]float64{false: 0, true: 1}[tc.fail]; got != want {
				t.Errorf("token request failures %v, want %v", got, want)
			}
		})
	}
}
