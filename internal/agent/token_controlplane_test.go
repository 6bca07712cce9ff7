package agent

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// TestAgentRenewsThePluginsTokenAtOnceWhenItsServiceAccountIsRecreated: the API
// server refuses a token once the ServiceAccount it was issued for is deleted, also
// when one of the same name is created again (helm uninstall and install racing, an
// admin applying it again): the token names the account's uid. Against a real API
// server, with the chart's grants: the ServiceAccount deleted, the agent is not
// ready, naming it, and says so once; created again, the kubeconfig on the node
// works again (a real request with its token) within one TokenRequest's bound
// (tokenRequestTimeout) and the agent is ready again; replaced at once (delete and
// create back to back, as kubectl replace --force does), the same. Before, the
// agent stayed ready with the dead token until its next renewal (half the token's
// lifetime: 30 minutes here, 12 hours with the chart's default), and every ADD that
// asked the API server failed meanwhile.
//
// With the pod cache (POD_CACHE_ENABLED, the chart's default) the agent stays ready
// meanwhile and says it by istio_cni_plugin_token_refused: only the ADDs the cache
// cannot answer need the token, and a node not ready is tainted, every node at once
// when the ServiceAccount is deleted.
func TestAgentRenewsThePluginsTokenAtOnceWhenItsServiceAccountIsRecreated(t *testing.T) {
	for _, podCache := range []bool{false, true} {
		t.Run(map[bool]string{false: "without the pod cache", true: "with the pod cache"}[podCache], func(t *testing.T) {
			testTokenRenewedWhenItsServiceAccountIsRecreated(t, podCache)
		})
	}
}

func testTokenRenewedWhenItsServiceAccountIsRecreated(t *testing.T, podCache bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var extra []rbacv1.PolicyRule
	if podCache {
		extra = append(extra, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
	}
	c := newExitCluster(t, ctx, extra...)
	if podCache {
		c.env = append(c.env, "POD_CACHE_ENABLED=true")
	}
	pod := c.agentPod(t, ctx, "istio-cni-node-a")
	p := c.start(t, pod)
	p.waitLog(t, "the agent watches the plugin's ServiceAccount", `watching the plugin's ServiceAccount`)

	// What the plugin does with the kubeconfig on the node: get a pod with its token.
	kubeconfigWorks := func() error {
		plugin, _ := c.pluginClient(t)
		_, err := plugin.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err
	}
	if err := kubeconfigWorks(); err != nil {
		t.Fatalf("the plugin's kubeconfig cannot get a pod: %v", err)
	}
	accounts := c.admin.CoreV1().ServiceAccounts(ns)
	create := func() time.Time {
		t.Helper()
		if _, err := accounts.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-plugin"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	remove := func() {
		t.Helper()
		if err := accounts.Delete(ctx, "istio-cni-plugin", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const refusedLine = `msg="the API server refuses the plugin's token`

	// Deleted: the token is refused, and the agent says so. (The API server keeps a
	// token's authentication for 10 s: refused only then.)
	remove()
	if podCache {
		eventually(t, 5*time.Second, "istio_cni_plugin_token_refused is 1", func() bool { return p.metric(t, "istio_cni_plugin_token_refused") == 1 })
		if code, body := p.readyz(); code != http.StatusOK {
			t.Errorf("with the pod cache, /readyz while the token is refused = %d %s, want 200", code, body)
		}
	} else {
		eventually(t, 5*time.Second, "/readyz is 503 naming the deleted ServiceAccount", func() bool {
			code, body := p.readyz()
			return code == http.StatusServiceUnavailable && strings.Contains(body, "ServiceAccount "+ns+"/istio-cni-plugin was deleted")
		})
		_, body := p.readyz()
		t.Logf("while deleted: %s", strings.TrimSpace(body))
	}
	eventually(t, 30*time.Second, "the API server refuses the kubeconfig's token", func() bool { return apierrors.IsUnauthorized(kubeconfigWorks()) })
	// Checked many times (the probes above, every 2 ms): said once.
	if n := strings.Count(p.stderr.String(), refusedLine); n != 1 {
		t.Errorf("the refusal is logged %d times, want once:\n%s", n, p.stderr.String())
	}

	// Created again: a new token at once.
	created := create()
	eventually(t, tokenRequestTimeout, "the kubeconfig on the node works again", func() bool { return kubeconfigWorks() == nil })
	worked := time.Since(created)
	eventually(t, tokenRequestTimeout, "the agent is ready again", p.ready)
	eventually(t, tokenRequestTimeout, "istio_cni_plugin_token_refused is 0 again", func() bool { return p.metric(t, "istio_cni_plugin_token_refused") == 0 })
	t.Logf("created again: the kubeconfig works after %v, the agent is ready after %v", worked.Round(time.Millisecond), time.Since(created).Round(time.Millisecond))

	// Replaced at once: no moment without the account, its tokens refused all the same.
	_, before := c.pluginClient(t)
	remove()
	replaced := create()
	eventually(t, tokenRequestTimeout, "the kubeconfig on the node holds a new token that works", func() bool {
		_, token := c.pluginClient(t)
		return token != before && kubeconfigWorks() == nil
	})
	worked = time.Since(replaced)
	eventually(t, tokenRequestTimeout, "the agent is ready", p.ready)
	t.Logf("replaced: the kubeconfig works after %v", worked.Round(time.Millisecond))

	if strings.Contains(p.stderr.String(), "cannot watch the plugin's ServiceAccount") {
		t.Errorf("the chart's grants do not let the agent watch the plugin's ServiceAccount:\n%s", p.stderr.String())
	}
	p.stop(t)
}

// TestAgentRenewsThePluginsTokenWhenItsNodeIsRegisteredAgain: the plugin's token
// is bound to the Node, and the API server refuses it once no node of its uid
// exists: a node deleted and registered again under the same name (kubectl delete
// node while the kubelet runs, then the kubelet restarted within the pod GC's
// 40 s, so that the agent and the node's pods live on) leaves every ADD that asks
// the API server failing with 401 until the token's renewal, 12 hours later with
// the chart's default (30 minutes here). The kubelet, registered again, renews the
// agent's own projected token, into which the API server writes the node's new
// uid: the agent now compares it with the plugin token's, is not ready meanwhile
// (without the pod cache), naming the node, and requests a new token at once.
func TestAgentRenewsThePluginsTokenWhenItsNodeIsRegisteredAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	pod := c.agentPod(t, ctx, "istio-cni-node-a")
	p := c.start(t, pod)
	kubeconfigWorks := func() error {
		plugin, _ := c.pluginClient(t)
		_, err := plugin.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err
	}
	eventually(t, tokenRequestTimeout, "the plugin's kubeconfig works", func() bool { return kubeconfigWorks() == nil })
	nodes := c.admin.CoreV1().Nodes()
	before, err := nodes.Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, token := c.pluginClient(t)
	if claims, _ := kube.ReadTokenClaims([]byte(token)); claims.Kubernetes.Node.UID != string(before.UID) {
		t.Fatalf("the plugin's token is bound to node uid %q, want node-a's %s", claims.Kubernetes.Node.UID, before.UID)
	}

	// Deleted and registered again: a new uid, and the plugin's token is refused.
	if err := nodes.Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: before.Labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the API server refuses the kubeconfig's token", func() bool { return apierrors.IsUnauthorized(kubeconfigWorks()) })

	// The kubelet renews the agent's projected token: the API server writes the
	// node's new uid into it.
	renewed := podToken(t, ctx, c.admin, pod)
	if claims, _ := kube.ReadTokenClaims([]byte(renewed)); claims.Kubernetes.Node.UID != string(after.UID) {
		t.Fatalf("the agent's renewed token names node uid %q, want the new node-a's %s", claims.Kubernetes.Node.UID, after.UID)
	}
	rotated := time.Now()
	c.n.rotateToken(t, renewed)
	eventually(t, tokenRequestTimeout, "the kubeconfig on the node works again", func() bool { return kubeconfigWorks() == nil })
	t.Logf("the kubeconfig works again %v after the agent's token was renewed", time.Since(rotated).Round(time.Millisecond))
	eventually(t, tokenRequestTimeout, "the agent is ready", p.ready)
	if !strings.Contains(p.stderr.String(), "node node-a was deleted and registered again") {
		t.Errorf("the agent did not say that the node was registered again:\n%s", p.stderr.String())
	}
	p.stop(t)
}
