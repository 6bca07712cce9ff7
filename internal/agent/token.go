package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// The plugin's token. The agent's own token is projected into its pod and bound to
// it: the API server stops accepting it once the pod is deleted. A plugin that used
// it could not look pods up from the moment a rolling update deletes the old agent
// pod until the new one has written its own token, and not at all while the
// DaemonSet's pod is gone after a reboot. So the agent asks the TokenRequest API
// for a token of the plugin's own ServiceAccount (PLUGIN_SERVICE_ACCOUNT: it may
// only read pods), bound to the Node rather than to a pod: it lives as long as the
// node object and its lifetime, whatever happens to agent pods.
//
// Bounds:
//   - lifetime: PLUGIN_TOKEN_LIFETIME (default 24 h; the API server may shorten it
//     with --service-account-max-token-expiration, and the agent uses what it got);
//   - renewal: at half the lifetime (renewIn: the token's own, from its claims, and
//     at least tokenRenewMin), so the plugin keeps working for at least half a
//     lifetime (12 h by default) with no agent running;
//   - each request: tokenRequestTimeout; failures are retried after 1 s, doubling up
//     to tokenRetryMax, while the kubeconfig keeps the previous token;
//   - a node suspended or hibernated (a laptop's kind or minikube, a VM's suspend):
//     Go's timers run on the monotonic clock, which stands still meanwhile, while
//     the token's expiry is by the wall clock, which does not; so the wait for a
//     renewal also looks at the wall clock at least every tokenWallCheck (untilDue).
const (
	DefaultPluginTokenLifetime = 24 * time.Hour
	MinPluginTokenLifetime     = 10 * time.Minute
	MaxPluginTokenLifetime     = 365 * 24 * time.Hour
	tokenRequestTimeout        = 10 * time.Second
	tokenRetryMax              = 30 * time.Second
	tokenRenewMin              = time.Minute
	tokenWallCheck             = time.Minute
)

// renewIn is how long until a token is renewed: half its lifetime. The lifetime is
// the token's own, its exp claim minus its iat claim, both by the API server's
// clock, so a node clock ahead of the API server's (an expiry already past by the
// node's clock) makes neither a tight loop of requests nor a renewal after the token
// has expired. A token without readable claims renews at half of what is left of
// expires by the node's clock. Never sooner than tokenRenewMin.
func renewIn(token []byte, expires, now time.Time) time.Duration {
	var wait time.Duration
	if iat, exp, ok := kube.TokenTimes(token); ok && exp > iat {
		wait = time.Duration(exp-iat) * time.Second / 2
	} else {
		wait = expires.Sub(now) / 2
	}
	return max(wait, tokenRenewMin)
}

// pluginToken is a token and when it expires.
type pluginToken struct {
	token   []byte
	expires time.Time
	// boundTo is what the API server bound the token to ("node x", or "nothing"
	// where node binding is refused).
	boundTo string
}

// tokenSource keeps a fresh token of the plugin's ServiceAccount.
type tokenSource struct {
	client    corev1client.ServiceAccountsGetter
	namespace string
	account   string
	node      string
	lifetime  time.Duration
	log       *slog.Logger
	// m, when set, gets the current token's expiry and each failed request.
	m *metrics
	// changed wakes the agent's loop when a new token is in.
	changed chan struct{}

	mu  sync.Mutex
	cur *pluginToken
	// failure is why the last request failed, while there is no token yet; nil
	// while the first request is still in flight.
	failure error
	// unbound is set once the API server refused node binding: later requests ask
	// for a token bound to nothing (it still expires).
	unbound bool
}

func newTokenSource(client corev1client.ServiceAccountsGetter, s *Settings, log *slog.Logger) *tokenSource {
	return &tokenSource{client: client, namespace: s.PodNamespace, account: s.PluginServiceAccount, node: s.NodeName,
		lifetime: s.PluginTokenLifetime, log: log, changed: make(chan struct{}, 1)}
}

// current is the latest token, or nil before the first one; failure then says why
// the last request failed, nil while the first is still in flight.
func (t *tokenSource) current() (tok *pluginToken, failure error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur, t.failure
}

// run requests a token now, then again at half its lifetime, until ctx ends.
func (t *tokenSource) run(ctx context.Context) {
	retry := time.Second
	for {
		tok, err := t.request(ctx)
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.mu.Lock()
			t.failure = err
			cur := t.cur
			t.mu.Unlock()
			if t.m != nil {
				t.m.tokenFailures.Inc()
			}
			attrs := []any{"serviceAccount", t.namespace + "/" + t.account, "error", err, "retryIn", retry}
			if cur != nil {
				t.log.Error("plugin token renewal failed; the plugin's kubeconfig keeps the current token until it expires",
					append(attrs, "expires", cur.expires.UTC().Format(time.RFC3339))...)
			} else {
				// No token of this agent's yet: what the plugin uses meanwhile (a previous
				// agent's kubeconfig, or none on a first install) the install step says.
				t.log.Error("plugin token request failed", attrs...)
			}
			wait, retry = retry, min(2*retry, tokenRetryMax)
		} else {
			retry = time.Second
			t.mu.Lock()
			t.cur, t.failure = tok, nil
			t.mu.Unlock()
			if t.m != nil {
				t.m.tokenExpiry.Set(float64(tok.expires.Unix()))
			}
			select {
			case t.changed <- struct{}{}:
			default:
			}
			wait = renewIn(tok.token, tok.expires, time.Now())
			t.log.Info("plugin token renewed", "serviceAccount", t.namespace+"/"+t.account, "boundTo", tok.boundTo,
				"expires", tok.expires.UTC().Format(time.RFC3339), "renewIn", wait.Round(time.Second))
		}
		if !untilDue(ctx, time.Now().Add(wait), time.Now, tokenWallCheck) {
			return
		}
	}
}

// untilDue waits until due by the monotonic clock or by the wall clock (now's,
// read at least every check), whichever comes first: a suspended node's monotonic
// clock stands still while its wall clock, by which tokens expire, goes on. False
// when ctx ends first.
func untilDue(ctx context.Context, due time.Time, now func() time.Time, check time.Duration) bool {
	for {
		left := min(due.Sub(now()), due.Round(0).Sub(now().Round(0)))
		if left <= 0 {
			return true
		}
		timer := time.NewTimer(min(left, check))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

func (t *tokenSource) request(ctx context.Context) (*pluginToken, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenRequestTimeout)
	defer cancel()
	secs := int64(t.lifetime / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}
	boundTo := "nothing"
	if !t.unbound && t.node != "" {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: t.node}
		boundTo = "node " + t.node
	}
	resp, err := t.client.ServiceAccounts(t.namespace).CreateToken(ctx, t.account, req, metav1.CreateOptions{})
	if err != nil && req.Spec.BoundObjectRef != nil && (apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)) {
		// Clusters before Kubernetes 1.32 do not bind tokens to nodes: take an unbound
		// one, which expires all the same.
		t.log.Warn("the API server does not bind tokens to nodes; the plugin's token is bound to nothing (it still expires)", "error", err)
		t.unbound = true
		return t.request(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", t.namespace, t.account, err)
	}
	if resp.Status.Token == "" {
		return nil, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: the API server returned no token", t.namespace, t.account)
	}
	return &pluginToken{token: []byte(resp.Status.Token), expires: resp.Status.ExpirationTimestamp.Time, boundTo: boundTo}, nil
}
