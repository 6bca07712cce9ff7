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
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
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
	jwt := func(iat, exp int64) []byte { return testJWT(iat, exp, "") }
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

// testJWT is a token shaped as the API server issues them (its signature is not
// checked by its holders), of the ServiceAccount istio-system/istio-cni-plugin of
// uid; no uid claim when uid is empty.
func testJWT(iat, exp int64, uid string) []byte {
	k8s := ""
	if uid != "" {
		k8s = fmt.Sprintf(`,"kubernetes.io":{"namespace":"istio-system","node":{"name":"node-a","uid":"n1"},"serviceaccount":{"name":"istio-cni-plugin","uid":%q}}`, uid)
	}
	payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"aud":["x"],"exp":%d,"iat":%d%s,"sub":"system:serviceaccount:istio-system:istio-cni-plugin"}`, exp, iat, k8s))
	return []byte("eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln")
}

// pluginAccount is the ServiceAccount istio-system/istio-cni-plugin of uid u1.
func pluginAccount() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-cni-plugin", UID: "u1"}}
}

// TestRefusalSaysWhyTheAPIServerRefusesTheToken: the API server refuses a token of
// a ServiceAccount deleted, or deleted and created again under its name (the token
// names the account's uid), and one past its expiry. What the agent knows of it
// decides its readiness: an account the watch has not listed (no grant, API server
// down) says nothing, nor does a token without a uid claim; the expiry is the
// token's receipt plus its lifetime by the node's clocks. A token bound to a node
// whose uid a later own token of the agent does not name (the node registered
// again) is refused; an earlier own token, or one of no node, says nothing.
func TestRefusalSaysWhyTheAPIServerRefusesTheToken(t *testing.T) {
	now := time.Unix(2_000_000_000, 0)
	tok := &pluginToken{accountUID: "u1", due: now.Add(time.Hour)}
	noUID := &pluginToken{due: now.Add(time.Hour)}
	expired := &pluginToken{accountUID: "u1", due: now.Add(-time.Second)}
	same := accountState{known: true, exists: true, uid: "u1"}
	// Bound to node-a of uid n1, issued at 100.
	bound := &pluginToken{accountUID: "u1", nodeUID: "n1", issued: 100, due: now.Add(time.Hour)}
	cases := []struct {
		name string
		tok  *pluginToken
		acct accountState
		want string // a part of the reason; "" for none
	}{
		{"no token", nil, accountState{known: true}, ""},
		{"account as issued", tok, same, ""},
		{"account not listed yet", tok, accountState{}, ""},
		{"account deleted", tok, accountState{known: true}, "ServiceAccount istio-system/istio-cni-plugin was deleted, and every token of it with it"},
		{"account created again", tok, accountState{known: true, exists: true, uid: "u2"},
			"ServiceAccount istio-system/istio-cni-plugin was deleted and created again (the token is of uid u1, the ServiceAccount's uid is now u2)"},
		{"token without a uid claim, account of a uid", noUID, accountState{known: true, exists: true, uid: "u2"}, ""},
		{"token without a uid claim, account deleted", noUID, accountState{known: true}, "was deleted"},
		{"expired", expired, same, "it expired at 2033-05-18T03:33:19Z by this node's clock"},
		{"expiry unknown", &pluginToken{accountUID: "u1"}, same, ""},
		{"node as bound", bound, same, ""},
		{"node registered again", bound, same, "node node-a was deleted and registered again (the token is bound to node uid n1, the node's uid is now n2"},
		{"an older own token of an earlier node", bound, same, ""},
		{"own token of no node", bound, same, ""},
		{"token bound to nothing", tok, same, ""},
	}
	nodes := map[string]nodeState{
		"node as bound":                         {name: "node-a", uid: "n1", issued: 200},
		"node registered again":                 {name: "node-a", uid: "n2", issued: 200},
		"an older own token of an earlier node": {name: "node-a", uid: "n0", issued: 50},
		"token bound to nothing":                {name: "node-a", uid: "n2", issued: 200},
	}
	for _, c := range cases {
		got := refusal(c.tok, c.acct, nodes[c.name], "istio-system", "istio-cni-plugin", now)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%s: refusal %q, want one saying %q", c.name, got, c.want)
		}
	}
}

// TestATokenPastItsExpiryIsRefusedWhenItsRenewalsFail: a token whose renewals all
// fail is known to be refused from its expiry on (its receipt plus its lifetime
// from its claims), not from the next failed request's: the wait for the next
// request ends at the expiry. The agent is then not ready, naming the expiry, with
// the kubeconfig still in place; a new token makes it ready again.
func TestATokenPastItsExpiryIsRefusedWhenItsRenewalsFail(t *testing.T) {
	const lifetime = 2 // seconds
	issued := false
	client := fake.NewClientset(pluginAccount())
	client.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		if issued {
			return true, nil, errors.New("the API server is down")
		}
		issued = true
		now := time.Now()
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{
			Token: string(testJWT(now.Unix(), now.Unix()+lifetime, "u1")), ExpirationTimestamp: metav1.NewTime(now.Add(lifetime * time.Second))}}, nil
	})
	sa := t.TempDir()
	writeFile(t, filepath.Join(sa, "ca.crt"), testCA(t), 0o644)
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa, "PLUGIN_SERVICE_ACCOUNT": "istio-cni-plugin", "POD_NAMESPACE": "istio-system",
		"POD_CACHE_ENABLED": "false"}) // the plugin's lookups all need the token
	s.RunDir = t.TempDir()
	var log logbuf.Buffer
	a := newAgent(&s, slog.New(slog.NewTextHandler(&log, nil)))
	a.tokens = newTokenSource(client.CoreV1(), &s, a.log)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.tokens.run(ctx) }()
	defer func() { cancel(); <-done }()

	var received time.Time
	eventually(t, 5*time.Second, "the first token is in", func() bool {
		tok, _, _ := a.tokens.current()
		received = time.Now()
		return tok != nil
	})
	// Only the kubeconfig step is looked at here (no CNI config, no binaries).
	kubeconfigReason := func() string {
		why := *a.whyNotReady.Load()
		if i := strings.Index(why, "the plugin's kubeconfig"); i >= 0 {
			return why[i:]
		}
		return ""
	}
	a.reconcile(dirtyKubeconfig)
	if !a.kubeOK || kubeconfigReason() != "" {
		t.Fatalf("the kubeconfig step is not done with a fresh token: %s", kubeconfigReason())
	}
	// Requests fail from now on, the first a minute away (the renewal's least
	// wait): the expiry, 2 s after the token came, is known within a moment of it.
	eventually(t, 5*time.Second, "the token is known to be refused", func() bool {
		_, _, refused := a.tokens.current()
		return refused != ""
	})
	if late := time.Since(received) - lifetime*time.Second; late > 500*time.Millisecond {
		t.Errorf("the expiry was known %v after it", late)
	}
	a.reconcile(dirtyKubeconfig)
	if why := kubeconfigReason(); a.kubeOK || !strings.HasPrefix(why, "the plugin's kubeconfig "+s.KubeconfigPath()+" is written, but the API server refuses the plugin's token: it expired at") {
		t.Errorf("the kubeconfig step is done (%v) with an expired token, reason %q", a.kubeOK, why)
	}
	if got := gathered(t, a.m, "istio_cni_plugin_token_refused", "", ""); got != 1 {
		t.Errorf("istio_cni_plugin_token_refused = %v with an expired token, want 1", got)
	}
	// With the pod cache the plugin needs the token only for the pods the cache
	// cannot answer: the step stays done (the node is not tainted for it), the
	// refusal said by the metric and the log.
	s.PodCache = true
	a.reconcile(dirtyKubeconfig)
	if !a.kubeOK || kubeconfigReason() != "" {
		t.Errorf("with the pod cache, the kubeconfig step is not done (%v) with an expired token: %q", a.kubeOK, kubeconfigReason())
	}
	if got := gathered(t, a.m, "istio_cni_plugin_token_refused", "", ""); got != 1 {
		t.Errorf("with the pod cache, istio_cni_plugin_token_refused = %v with an expired token, want 1", got)
	}
	if kc, err := os.ReadFile(s.KubeconfigPath()); err != nil || len(kc) == 0 {
		t.Errorf("the kubeconfig is gone: %v", err)
	}
	if n := strings.Count(log.String(), `msg="the API server refuses the plugin's token`); n != 1 {
		t.Errorf("the refusal is logged %d times, want once (by the token source):\n%s", n, log.String())
	}

	now := time.Now()
	a.tokens.issued(&pluginToken{token: testJWT(now.Unix(), now.Unix()+3600, "u1"), expires: now.Add(time.Hour)}, now)
	a.reconcile(dirtyKubeconfig)
	if !a.kubeOK || kubeconfigReason() != "" {
		t.Errorf("the kubeconfig step is not done with a new token: %s", kubeconfigReason())
	}
}

// TestAFailedTokenRequestIsLoggedOncePerError: while renewals keep failing with
// the same error (the API server down for an hour: a request every 30 s), the
// error is logged once, and again only when it changes; each failure is counted.
func TestAFailedTokenRequestIsLoggedOncePerError(t *testing.T) {
	var log logbuf.Buffer
	s := Settings{PodNamespace: "istio-system", PluginServiceAccount: "istio-cni-plugin", NodeName: "node-a", PluginTokenLifetime: time.Hour}
	ts := newTokenSource(nil, &s, slog.New(slog.NewTextHandler(&log, nil)))
	ts.m = newMetrics()
	down := errors.New("connect: connection refused")
	for _, err := range []error{down, down, down, errors.New("context deadline exceeded"), down} {
		ts.failed(err, time.Second)
	}
	if n := strings.Count(log.String(), "plugin token request failed"); n != 3 {
		t.Errorf("%d failure lines for 5 failures with 3 changes of error, want 3:\n%s", n, log.String())
	}
	if got := gathered(t, ts.m, "istio_cni_plugin_token_request_failures_total", "", ""); got != 5 {
		t.Errorf("token request failures %v, want 5", got)
	}
}

// TestAnAgentThatMayNotWatchThePluginsServiceAccountSaysSoOnce: without list and
// watch on the plugin's ServiceAccount (an older chart's grants, a hand-made Role),
// the agent says once what it cannot notice and which grant it needs, not at each
// of client-go's retries; its tokens are requested as before.
func TestAnAgentThatMayNotWatchThePluginsServiceAccountSaysSoOnce(t *testing.T) {
	client := fake.NewClientset()
	var lists atomic.Int64
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts"}, "", errors.New("no grant"))
	// client-go lists by a watch of the initial events where the API server serves
	// it, and by a list otherwise: both refused.
	client.PrependReactor("list", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return true, nil, forbidden
	})
	client.PrependWatchReactor("serviceaccounts", func(k8stesting.Action) (bool, watch.Interface, error) {
		lists.Add(1)
		return true, nil, forbidden
	})
	s := Settings{PodNamespace: "istio-system", PluginServiceAccount: "istio-cni-plugin", NodeName: "node-a", PluginTokenLifetime: time.Hour}
	var log logbuf.Buffer
	ts := newTokenSource(client.CoreV1(), &s, slog.New(slog.NewTextHandler(&log, nil)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); ts.watchAccount(ctx) }()
	eventually(t, 10*time.Second, "the list is tried three times", func() bool { return lists.Load() >= 3 })
	cancel()
	<-done
	if n := strings.Count(log.String(), "cannot watch the plugin's ServiceAccount"); n != 1 {
		t.Errorf("%d lines for %d refused lists, want 1:\n%s", n, lists.Load(), log.String())
	}
	if !strings.Contains(log.String(), "list and watch on serviceaccounts istio-cni-plugin in istio-system") {
		t.Errorf("the line does not name the grant:\n%s", log.String())
	}
	if _, _, refused := ts.current(); refused != "" {
		t.Errorf("an account never listed makes the token refused: %s", refused)
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
	if !untilDue(ctx, time.Now().Add(time.Hour), suspended, 10*time.Millisecond, nil) {
		t.Fatalf("a renewal due in 1 h by the monotonic clock and past by the wall clock: still waiting after %s", time.Since(start).Round(time.Millisecond))
	}

	// Awake, the wait is the monotonic one, and the context ends it.
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if untilDue(ctx, time.Now().Add(time.Hour), time.Now, 10*time.Millisecond, nil) {
		t.Error("a renewal due in 1 h came within 100 ms")
	}
	start = time.Now()
	if !untilDue(t.Context(), time.Now().Add(50*time.Millisecond), time.Now, time.Minute, nil) || time.Since(start) < 50*time.Millisecond {
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
			client := fake.NewClientset(pluginAccount())
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
			client := fake.NewClientset(pluginAccount())
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
				if tok, failure, _ := ts.current(); tok != nil || failure != nil {
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
