package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/informer"
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
//     to tokenRetryMax, while the kubeconfig keeps the previous token; a failure is
//     logged when its error differs from the last one's (the metric counts each);
//   - a node suspended or hibernated (a laptop's kind or minikube, a VM's suspend):
//     Go's timers run on the monotonic clock, which stands still meanwhile, while
//     the token's expiry is by the wall clock, which does not; so the wait for a
//     renewal also looks at the wall clock at least every tokenWallCheck (untilDue).
//
// A token the API server refuses. It refuses a token once the ServiceAccount it was
// issued for is gone: deleted, or deleted and created again under the same name
// (helm uninstall and install racing, an admin applying it again), since the token
// names the account's uid. The agent watches the plugin's ServiceAccount (a list
// and watch of that one name) and compares its uid with the token's: a deleted
// account is known at once, and its creation wakes a new request at once, whatever
// the retry's delay, so the plugin's kubeconfig works again within one request
// (tokenRequestTimeout) of the account's return. It refuses a token bound to a
// node of another uid than the node of that name now (deleted and registered
// again): the agent's own token, which the kubelet renews, names the node's uid
// (nodeState), and one issued later that names another wakes a new request at
// once (ownTokenSeen). It also refuses a token past its
// expiry, which only renewals failing for half a lifetime let happen; the expiry is
// counted from the token's receipt with its own lifetime, by the monotonic and the
// wall clock alike (whichever says it is over first). Meanwhile the agent is not
// ready, saying why (refusal): every ADD that asks the API server would fail.
const (
	DefaultPluginTokenLifetime = 24 * time.Hour
	MinPluginTokenLifetime     = 10 * time.Minute
	MaxPluginTokenLifetime     = 365 * 24 * time.Hour
	tokenRequestTimeout        = 10 * time.Second
	tokenRetryMax              = 30 * time.Second
	tokenRenewMin              = time.Minute
	tokenWallCheck             = time.Minute
)

// tokenLifetime is a token's lifetime: its exp claim minus its iat claim, both by
// the API server's clock, so that neither the renewal nor the expiry the agent
// counts from the token's receipt depends on how the node's clock stands to the
// API server's. A token without readable claims: what is left of expires by the
// node's clock at now, its receipt.
func tokenLifetime(token []byte, expires, now time.Time) time.Duration {
	if iat, exp, ok := kube.TokenTimes(token); ok && exp > iat {
		return time.Duration(exp-iat) * time.Second
	}
	return expires.Sub(now)
}

// renewIn is how long until a token is renewed: half its lifetime (tokenLifetime),
// so a node clock ahead of the API server's (an expiry already past by the node's
// clock) makes neither a tight loop of requests nor a renewal after the token has
// expired. Never sooner than tokenRenewMin.
func renewIn(token []byte, expires, now time.Time) time.Duration {
	return max(tokenLifetime(token, expires, now)/2, tokenRenewMin)
}

// pluginToken is a token and when it expires.
type pluginToken struct {
	token   []byte
	expires time.Time
	// boundTo is what the API server bound the token to ("node x", or "nothing"
	// where node binding is refused).
	boundTo string
	// nodeUID is the uid of the node it is bound to, from its claims ("" when it
	// has none: bound to nothing), and issued its iat claim.
	nodeUID string
	issued  int64
	// accountUID is the uid of the ServiceAccount it was issued for, from its
	// claims ("" when it has none).
	accountUID string
	// due is when it expires by this node's clocks: its receipt (with the monotonic
	// reading) plus its lifetime; zero when unknown.
	due time.Time
}

// accountState is what the watch last said of the plugin's ServiceAccount.
type accountState struct {
	// known: the watch has listed it; until then nothing is judged by it.
	known  bool
	exists bool
	uid    string
}

// nodeState is what the agent's own token, the latest the kubelet wrote into its
// projected volume, says of this node: the kubelet renews it well before it
// expires (within the hour), and when it starts, and the API server writes the
// uid of the pod's node into it. A node deleted and registered again under the
// same name (kubectl delete node while its kubelet runs, the kubelet restarted
// within the pod GC's 40 s so that its pods live on) has another uid, and a token
// bound to the earlier one is refused.
type nodeState struct {
	name, uid string
	// issued is the token's iat claim: only a token issued after the plugin's
	// says the plugin's node is gone.
	issued int64
}

// left is the time until due by the monotonic clock or by the wall clock,
// whichever is less: a suspended node's monotonic clock stands still while its
// wall clock, by which tokens expire, goes on.
func left(due, now time.Time) time.Duration {
	return min(due.Sub(now), due.Round(0).Sub(now.Round(0)))
}

// refusal says why the API server refuses tok, as far as the agent can tell: the
// ServiceAccount namespace/name deleted, or deleted and created again (its uid is
// not the token's), or the token past its expiry by this node's clocks. Empty when
// nothing says it is refused (or there is no token).
func refusal(tok *pluginToken, acct accountState, node nodeState, namespace, name string, now time.Time) string {
	switch {
	case tok == nil:
		return ""
	case acct.known && !acct.exists:
		return fmt.Sprintf("ServiceAccount %s/%s was deleted, and every token of it with it; a new token is requested as soon as it is created again",
			namespace, name)
	case acct.known && tok.accountUID != "" && acct.uid != tok.accountUID:
		return fmt.Sprintf("ServiceAccount %s/%s was deleted and created again (the token is of uid %s, the ServiceAccount's uid is now %s); a new token is being requested",
			namespace, name, tok.accountUID, acct.uid)
	case node.uid != "" && tok.nodeUID != "" && node.uid != tok.nodeUID && node.issued > tok.issued:
		return fmt.Sprintf("node %s was deleted and registered again (the token is bound to node uid %s, the node's uid is now %s by this agent's own token); a new token is being requested",
			node.name, tok.nodeUID, node.uid)
	case !tok.due.IsZero() && left(tok.due, now) <= 0:
		return fmt.Sprintf("it expired at %s by this node's clock, and no renewal has succeeded since", tok.due.UTC().Format(time.RFC3339))
	}
	return ""
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
	// changed wakes the agent's loop when a new token is in, or when what the
	// agent knows of its refusal changed.
	changed chan struct{}
	// renew wakes run for a request now: the ServiceAccount came back.
	renew chan struct{}

	mu  sync.Mutex
	cur *pluginToken
	// failure is why the last request failed, while there is no token yet; nil
	// while the first request is still in flight.
	failure error
	// unbound is set once the API server refused node binding: later requests ask
	// for a token bound to nothing (it still expires).
	unbound bool
	// acct is what the watch last said of the ServiceAccount.
	acct accountState
	// ownNode is what the agent's own token last said of this node (ownTokenSeen).
	ownNode nodeState
	// refused is refusal's answer for cur when last judged.
	refused string
	// lastFailure is the error of the last failed request since the last success
	// (logged once while it stays the same), failures their number.
	lastFailure string
	failures    int
}

func newTokenSource(client corev1client.ServiceAccountsGetter, s *Settings, log *slog.Logger) *tokenSource {
	return &tokenSource{client: client, namespace: s.PodNamespace, account: s.PluginServiceAccount, node: s.NodeName,
		lifetime: s.PluginTokenLifetime, log: log, changed: make(chan struct{}, 1), renew: make(chan struct{}, 1)}
}

// current is the latest token, or nil before the first one; failure then says why
// the last request failed, nil while the first is still in flight. refused says
// why the API server refuses the token ("" while nothing says it does).
func (t *tokenSource) current() (tok *pluginToken, failure error, refused string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur, t.failure, t.refused
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// judge updates refused for what is known at now, logs a change and wakes the
// agent's loop for it; it returns refused. Called with mu held.
func (t *tokenSource) judge(now time.Time) string {
	r := refusal(t.cur, t.acct, t.ownNode, t.namespace, t.account, now)
	if r == t.refused {
		return r
	}
	t.refused = r
	if r != "" {
		t.log.Error("the API server refuses the plugin's token: the agent is not ready until a new one is in",
			"serviceAccount", t.namespace+"/"+t.account, "reason", r)
	} else {
		t.log.Info("the plugin's token is no longer known to be refused", "serviceAccount", t.namespace+"/"+t.account)
	}
	wake(t.changed)
	return r
}

// accountSeen takes what the watch says of the ServiceAccount now. An account
// that exists and is another than the watch saw before (created again), or leaves
// the token refused, or comes after a request failed, asks for a request now
// rather than after the renewal's or the retry's wait.
func (t *tokenSource) accountSeen(acct accountState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.acct
	t.acct = acct
	r := t.judge(time.Now())
	if acct != prev && acct.exists && (prev.known && prev.uid != acct.uid || r != "" || t.lastFailure != "") {
		wake(t.renew)
	}
}

// ownTokenSeen takes the agent's own token as the kubelet last wrote it: a newer
// one whose node uid is not the plugin token's says the node was registered
// again, and the plugin's token is refused; a request is asked for now.
func (t *tokenSource) ownTokenSeen(token []byte) {
	c, ok := kube.ReadTokenClaims(token)
	if !ok || c.Kubernetes.Node.UID == "" {
		return
	}
	n := nodeState{name: c.Kubernetes.Node.Name, uid: c.Kubernetes.Node.UID, issued: c.IssuedAt}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n == t.ownNode {
		return
	}
	t.ownNode = n
	if t.judge(time.Now()) != "" && t.cur != nil && t.cur.nodeUID != n.uid {
		wake(t.renew)
	}
}

// issued takes a new token received at now, and returns refusal's answer for it
// and the number of requests that failed before it.
func (t *tokenSource) issued(tok *pluginToken, now time.Time) (refused string, failuresBefore int) {
	if c, ok := kube.ReadTokenClaims(tok.token); ok {
		tok.accountUID = c.Kubernetes.ServiceAccount.UID
		tok.nodeUID, tok.issued = c.Kubernetes.Node.UID, c.IssuedAt
	}
	if d := tokenLifetime(tok.token, tok.expires, now); d > 0 {
		tok.due = now.Add(d)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	failuresBefore = t.failures
	t.cur, t.failure = tok, nil
	t.lastFailure, t.failures = "", 0
	if t.m != nil {
		t.m.tokenExpiry.Set(float64(tok.expires.Unix()))
	}
	wake(t.changed)
	return t.judge(now), failuresBefore
}

// failed takes a failed request's error; retry is the wait before the next.
func (t *tokenSource) failed(err error, retry time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failure = err
	t.failures++
	if t.m != nil {
		t.m.tokenFailures.Inc()
	}
	if err.Error() == t.lastFailure {
		return
	}
	t.lastFailure = err.Error()
	attrs := []any{"serviceAccount", t.namespace + "/" + t.account, "error", err, "retryIn", retry}
	switch {
	case t.cur == nil:
		// No token of this agent's yet: what the plugin uses meanwhile (a previous
		// agent's kubeconfig, or none on a first install) the install step says.
		t.log.Error("plugin token request failed", attrs...)
	case t.refused != "":
		t.log.Error("plugin token request failed; the plugin's kubeconfig keeps its current token, which the API server refuses",
			append(attrs, "refused", t.refused)...)
	default:
		t.log.Error("plugin token renewal failed; the plugin's kubeconfig keeps the current token until it expires",
			append(attrs, "expires", t.cur.expires.UTC().Format(time.RFC3339))...)
	}
}

// untilExpiry is the time until the current token expires by this node's clocks;
// zero or less when it has, or when it is unknown.
func (t *tokenSource) untilExpiry(now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur == nil || t.cur.due.IsZero() {
		return 0
	}
	return left(t.cur.due, now)
}

// run requests a token now, then again at half its lifetime, until ctx ends; the
// ServiceAccount's watch runs beside it.
func (t *tokenSource) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { t.watchAccount(ctx) })
	retry := time.Second
	for {
		// A wake from before this request is answered by it.
		select {
		case <-t.renew:
		default:
		}
		tok, err := t.request(ctx)
		now := time.Now()
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			t.failed(err, retry)
			wait, retry = retry, min(2*retry, tokenRetryMax)
		default:
			refused, failures := t.issued(tok, now)
			if refused != "" {
				// The watch says the account is gone or another: it lags the request, or
				// the account changed meanwhile. Asked again, as after a failure.
				wait, retry = retry, min(2*retry, tokenRetryMax)
			} else {
				retry = time.Second
				wait = renewIn(tok.token, tok.expires, now)
			}
			attrs := []any{"serviceAccount", t.namespace + "/" + t.account, "boundTo", tok.boundTo,
				"expires", tok.expires.UTC().Format(time.RFC3339), "renewIn", wait.Round(time.Second)}
			if failures > 0 {
				attrs = append(attrs, "failedRequestsBefore", failures)
			}
			t.log.Info("plugin token renewed", attrs...)
		}
		// Awake at the token's expiry too, to say it is refused from then on.
		if d := t.untilExpiry(now); d > 0 {
			wait = min(wait, d)
		}
		if !untilDue(ctx, now.Add(wait), time.Now, tokenWallCheck, t.renew) {
			return
		}
		t.mu.Lock()
		t.judge(time.Now())
		t.mu.Unlock()
	}
}

// untilDue waits until due by the monotonic clock or by the wall clock (now's,
// read at least every check), whichever comes first (left), or until wake: a
// suspended node's monotonic clock stands still while its wall clock, by which
// tokens expire, goes on. False when ctx ends first.
func untilDue(ctx context.Context, due time.Time, now func() time.Time, check time.Duration, wake <-chan struct{}) bool {
	for {
		rest := left(due, now())
		if rest <= 0 {
			return true
		}
		timer := time.NewTimer(min(rest, check))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-wake:
			timer.Stop()
			return true
		case <-timer.C:
		}
	}
}

// watchAccount keeps acct up to date from a watch of the plugin's ServiceAccount:
// a list and watch of that one name (field selector metadata.name), which RBAC
// grants by resourceNames. Until it has listed (no grant, API server down) the
// account is unknown, and the token is judged by its expiry only; a watch that
// fails is logged once per distinct error, not at each of client-go's retries.
func (t *tokenSource) watchAccount(ctx context.Context) {
	api := t.client.ServiceAccounts(t.namespace)
	inf := informer.New(&corev1.ServiceAccount{}, informer.Selector{Field: fields.OneTermEqualSelector("metadata.name", t.account).String()},
		api.List, api.Watch)
	var mu sync.Mutex
	var reported string
	// SetWatchErrorHandlerWithContext fails only on an informer already started.
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // a watch's normal end: relisted at once
		}
		mu.Lock()
		defer mu.Unlock()
		if err.Error() == reported {
			return
		}
		reported = err.Error()
		t.log.Warn("cannot watch the plugin's ServiceAccount: a deleted or recreated one is noticed only at the next renewal; "+
			"the agent needs list and watch on serviceaccounts "+t.account+" in "+t.namespace+" (the chart grants them)",
			"serviceAccount", t.namespace+"/"+t.account, "error", err)
	})
	key := t.namespace + "/" + t.account
	look := func() {
		// One look at a time, each reading the store as it is then: the last one
		// leaves the latest state.
		mu.Lock()
		defer mu.Unlock()
		if !inf.HasSynced() {
			return
		}
		st := accountState{known: true}
		if obj, exists, _ := inf.GetStore().GetByKey(key); exists {
			if sa, ok := obj.(*corev1.ServiceAccount); ok {
				st.exists, st.uid = true, string(sa.UID)
			}
		}
		t.accountSeen(st)
	}
	// AddEventHandler fails only on an informer that has stopped.
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { look() },
		UpdateFunc: func(any, any) { look() },
		DeleteFunc: func(any) { look() },
	})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			look()
			t.log.Info("watching the plugin's ServiceAccount: a deleted or recreated one makes the agent request a new token at once",
				"serviceAccount", key)
		}
	}()
	inf.RunWithContext(ctx)
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
