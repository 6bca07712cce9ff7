package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/chartrender"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/silent"
)

// taintRules are what the node readiness taint adds to the chart's default grants
// (taint.enabled; test/scale.AgentRules holds the chart's own, checked by test/chart).
var taintRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
}

// exitCluster is a real API server holding what a DaemonSet's agent sees: the
// chart's ServiceAccounts, RBAC and DaemonSet as a default install renders them
// (chartrender: the reviewed render test/chart keeps equal to helm's), the node, and
// agent pods the DaemonSet controls (no controller manager runs: the test creates
// and deletes the pods a DaemonSet controller would). The agent runs as the chart's
// ServiceAccount, with the chart's grants and no others.
type exitCluster struct {
	cp    *controlplane.ControlPlane
	admin kubernetes.Interface
	ds    *appsv1.DaemonSet
	n     *node
	env   []string
}

// ns is the release namespace of the chart's render.
const ns = chartrender.Namespace

// newExitCluster starts the API server and applies the chart; extraRules, when
// given, are granted to the agent's ServiceAccount beside the chart's (a feature
// the default install leaves off).
func newExitCluster(t *testing.T, ctx context.Context, extraRules ...rbacv1.PolicyRule) *exitCluster {
	t.Helper()
	return newExitClusterWith(t, ctx, controlplane.Options{}, extraRules...)
}

// newExitClusterWith is newExitCluster with the control plane started with opts
// (an audit log, say).
func newExitClusterWith(t *testing.T, ctx context.Context, opts controlplane.Options, extraRules ...rbacv1.PolicyRule) *exitCluster {
	t.Helper()
	cp := controlplane.StartForTest(t, opts)
	c := &exitCluster{cp: cp, admin: cp.AdminClient()}
	chart, err := chartrender.Load("default")
	if err != nil {
		t.Fatal(err)
	}
	if err := chart.ApplyRBAC(ctx, c.admin); err != nil {
		t.Fatal(err)
	}
	if len(extraRules) > 0 {
		if _, err := cp.ServiceAccountKubeconfig(ctx, ns, "istio-cni", extraRules); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a",
		Labels: map[string]string{"kubernetes.io/os": "linux"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := chart.DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	if c.ds, err = c.admin.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.n = newNode(t)
	writeFile(t, filepath.Join(c.n.saDir, "ca.crt"), cp.CAData(), 0o644)
	u, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	c.env = []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port(),
		"CHAINED_CNI_PLUGIN=false", "POD_NAMESPACE=" + ns, "NODE_NAME=node-a",
		"UNINSTALL_ON_EXIT=auto", "PLUGIN_SERVICE_ACCOUNT=istio-cni-plugin", "PLUGIN_TOKEN_LIFETIME=1h"}
	return c
}

// chartGracePeriod is the terminationGracePeriodSeconds of the chart's DaemonSet as
// a default install renders it: the time the kubelet gives the agent to exit.
func chartGracePeriod(t *testing.T) time.Duration {
	t.Helper()
	chart, err := chartrender.Load("default")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := chart.DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
}

// podToken is the istio-cni ServiceAccount's token bound to pod, an hour long: the
// projected token the kubelet gives the agent's pod (and renews).
func podToken(t *testing.T, ctx context.Context, admin kubernetes.Interface, pod *corev1.Pod) string {
	t.Helper()
	secs := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, "istio-cni", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// agentPod creates the pod the DaemonSet controller would, and gives the agent that
// pod's projected token, bound to the pod as the kubelet's is.
func (c *exitCluster) agentPod(t *testing.T, ctx context.Context, name string) *corev1.Pod {
	t.Helper()
	pod, err := c.admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: c.ds.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: c.ds.Name, UID: c.ds.UID,
				Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "istio-cni",
			Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.n.rotateToken(t, podToken(t, ctx, c.admin, pod))
	return pod
}

func (c *exitCluster) start(t *testing.T, pod *corev1.Pod) *agentProc {
	t.Helper()
	p := c.n.startAgent(t, append(c.env, "POD_NAME="+pod.Name)...)
	p.waitReady(t)
	p.waitLog(t, "the agent learnt its DaemonSet", `exit decision watches this agent's DaemonSet`)
	return p
}

// pluginClient is a client with the token of the plugin's kubeconfig on the node.
func (c *exitCluster) pluginClient(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(c.n.kubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	token := kc.AuthInfos["istio-cni"].Token
	cfg := c.cp.AdminRESTConfig()
	cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData = nil, nil
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client, token
}

// agentClient is a client with the agent's current projected token.
func (c *exitCluster) agentClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(c.n.saDir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.cp.AdminRESTConfig()
	cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData = nil, nil
	cfg.BearerToken = string(token)
	return kubernetes.NewForConfigOrDie(cfg)
}

func (n *node) kubeconfigPath() string { return filepath.Join(n.runDir, "istio-cni-kubeconfig") }

// installed reports what of the plugin is on the node.
func (n *node) installed() (conf, bin, kubeconfig bool) {
	_, err := os.Stat(filepath.Join(n.confDir, DefaultStandaloneName))
	conf = err == nil
	// istio-iptables: the plugin's own binary stays after an uninstall, for the DELs
	// of the pods it set up (TestADELOfAPodSetUpBeforeTheUninstallSucceeds).
	_, err = os.Stat(filepath.Join(n.binDir, "istio-iptables"))
	bin = err == nil
	_, err = os.Stat(n.kubeconfigPath())
	return conf, bin, err == nil
}

// claims decodes a JWT's payload (not its signature: the API server checks that).
func claims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestAgentKeepsThePluginAcrossARestartAndItsTokenOutlivesThePod: a rolling update as
// the DaemonSet controller does it, against a real API server. The old agent gets
// SIGTERM and keeps the entry, the binaries and the kubeconfig (its DaemonSet still
// fits the node); its pod is deleted, which kills its own projected token, and the
// plugin's token (the plugin's ServiceAccount, bound to the node) still reads pods;
// the new agent takes over without rewriting the config file.
func TestAgentKeepsThePluginAcrossARestartAndItsTokenOutlivesThePod(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	old := c.agentPod(t, ctx, "istio-cni-node-old")
	p := c.start(t, old)

	plugin, token := c.pluginClient(t)
	cl := claims(t, token)
	if sub := cl["sub"]; sub != "system:serviceaccount:"+ns+":istio-cni-plugin" {
		t.Errorf("the plugin's token is for %v, want the plugin's own ServiceAccount", sub)
	}
	k8s, _ := cl["kubernetes.io"].(map[string]any)
	if nodeClaim, _ := k8s["node"].(map[string]any); nodeClaim["name"] != "node-a" {
		t.Errorf("the plugin's token is not bound to node-a: kubernetes.io claims %v", k8s)
	}
	if _, err := plugin.CoreV1().Pods(ns).Get(ctx, old.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the plugin's token cannot get a pod: %v", err)
	}
	if _, err := plugin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin's token may list pods (%v): it must only get them", err)
	}
	confPath := filepath.Join(c.n.confDir, DefaultStandaloneName)
	confBefore, err := os.Stat(confPath)
	if err != nil {
		t.Fatal(err)
	}

	p.stop(t)
	p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*still runs on node node-a`)
	if conf, bin, kc := c.n.installed(); !conf || !bin || !kc {
		t.Fatalf("after a restart's SIGTERM: config %v, binary %v, kubeconfig %v; want all kept", conf, bin, kc)
	}

	// The DaemonSet controller deletes the old pod: its bound token dies with it.
	if err := c.admin.CoreV1().Pods(ns).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	oldClient := c.agentClient(t)
	eventually(t, 20*time.Second, "the deleted pod's own token is refused", func() bool {
		_, err := oldClient.CoreV1().Pods(ns).Get(ctx, "anything", metav1.GetOptions{})
		return apierrors.IsUnauthorized(err)
	})
	if _, err := plugin.CoreV1().Pods(ns).Get(ctx, "istio-cni-node-old", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("with no agent running and its pod gone, the plugin's token: %v, want a normal answer (not found)", err)
	}

	// The new agent: same node, new pod, new projected token.
	next := c.agentPod(t, ctx, "istio-cni-node-new")
	p2 := c.start(t, next)
	p2.waitLog(t, "a new plugin token", `plugin token renewed`)
	eventually(t, 10*time.Second, "the kubeconfig carries the new agent's token", func() bool {
		_, tok := c.pluginClient(t)
		return tok != token
	})
	confAfter, err := os.Stat(confPath)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(confBefore, confAfter) || !confAfter.ModTime().Equal(confBefore.ModTime()) {
		t.Errorf("the new agent rewrote the unchanged config file")
	}
	if ino := confAfter.Sys().(*syscall.Stat_t).Ino; ino != confBefore.Sys().(*syscall.Stat_t).Ino {
		t.Errorf("config file replaced (inode %d -> %d)", confBefore.Sys().(*syscall.Stat_t).Ino, ino)
	}
	p2.stop(t)
}

// TestAgentUninstallsWhenNoAgentWillComeBack: each way a DaemonSet stops running on
// a node ends in a full uninstall, and says why.
func TestAgentUninstallsWhenNoAgentWillComeBack(t *testing.T) {
	cases := []struct {
		name   string
		remove func(t *testing.T, ctx context.Context, c *exitCluster)
		reason string
	}{
		{"the DaemonSet no longer selects the node", func(t *testing.T, ctx context.Context, c *exitCluster) {
			ds, err := c.admin.AppsV1().DaemonSets(ns).Get(ctx, c.ds.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ds.Spec.Template.Spec.NodeSelector["pool"] = "mesh"
			if _, err := c.admin.AppsV1().DaemonSets(ns).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, `uninstalling.*no longer runs on node node-a: its node selector`},
		{"the DaemonSet is deleted (helm uninstall)", func(t *testing.T, ctx context.Context, c *exitCluster) {
			if err := c.admin.AppsV1().DaemonSets(ns).Delete(ctx, c.ds.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, `uninstalling.*DaemonSet ` + ns + `/istio-cni-node is deleted`},
		// helm uninstall deletes the DaemonSet, then the bindings: the DaemonSet is kept
		// here so that only the refusal decides.
		{"the agent's grants are deleted (helm uninstall deletes them with the DaemonSet)", func(t *testing.T, ctx context.Context, c *exitCluster) {
			if err := c.admin.RbacV1().RoleBindings(ns).Delete(ctx, "istio-cni-agent", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := c.admin.RbacV1().ClusterRoleBindings().Delete(ctx, "istio-cni", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			agent := c.agentClient(t)
			eventually(t, 20*time.Second, "the agent's reads are refused", func() bool {
				_, err := agent.AppsV1().DaemonSets(ns).Get(ctx, c.ds.Name, metav1.GetOptions{})
				_, nerr := agent.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
				return apierrors.IsForbidden(err) && apierrors.IsForbidden(nerr)
			})
		}, `uninstalling.*the API server forbids this agent to get daemonsets.apps istio-cni-node in namespace ` + ns + ` \(HTTP 403 Forbidden\)`},
		{"the ServiceAccounts are deleted (helm uninstall), the agent's pod with them", func(t *testing.T, ctx context.Context, c *exitCluster) {
			for _, sa := range []string{"istio-cni", "istio-cni-plugin"} {
				if err := c.admin.CoreV1().ServiceAccounts(ns).Delete(ctx, sa, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.admin.CoreV1().Pods(ns).Delete(ctx, "istio-cni-node-a", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				t.Fatal(err)
			}
			plugin, _ := c.pluginClient(t)
			agent := c.agentClient(t)
			eventually(t, 20*time.Second, "the agent's and the plugin's tokens are refused", func() bool {
				_, err := plugin.CoreV1().Pods(ns).Get(ctx, "anything", metav1.GetOptions{})
				_, aerr := agent.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
				return apierrors.IsUnauthorized(err) && apierrors.IsUnauthorized(aerr)
			})
		}, `uninstalling.*refuses this agent's identity.*and the plugin's`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			c := newExitCluster(t, ctx)
			p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-a"))
			tc.remove(t, ctx, c)
			p.stop(t)
			p.waitLog(t, "the agent said why it uninstalled", tc.reason)
			if conf, bin, kc := c.n.installed(); conf || bin || kc {
				t.Errorf("after removal: config %v, binary %v, kubeconfig %v left; want none", conf, bin, kc)
			}
		})
	}
}

// TestAgentRemovesItsNodesTaintWhenNoAgentWillComeBack: with the node readiness
// taint on and another agent leading it (so that only the exit path can act here),
// an agent whose DaemonSet is deleted removes the taint key from its own node as it
// uninstalls, and leaves the node's other taints; one that restarts (the DaemonSet
// still runs there) leaves it, as the next agent will be there to lift it.
func TestAgentRemovesItsNodesTaintWhenNoAgentWillComeBack(t *testing.T) {
	for _, removal := range []bool{false, true} {
		t.Run(map[bool]string{false: "restart keeps it", true: "DaemonSet deleted removes it"}[removal], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			c := newExitCluster(t, ctx, taintRules...)
			// Another agent leads, for an hour: this one stays a standby.
			now := metav1.NewMicroTime(time.Now())
			if _, err := c.admin.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-taint", Namespace: ns},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("istio-cni-node-elsewhere"), LeaseDurationSeconds: ptr.To[int32](3600),
					AcquireTime: &now, RenewTime: &now},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			nd, err := c.admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			other := corev1.Taint{Key: "example.com/gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
			nd.Spec.Taints = append(nd.Spec.Taints, other, corev1.Taint{Key: "cni.istio.io/not-ready", Value: "true", Effect: corev1.TaintEffectNoSchedule})
			if _, err := c.admin.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			c.env = append(c.env, "TAINT_ENABLED=true", "TAINT_LEASE_DURATION=2s", "TAINT_RENEW_DEADLINE=1500ms", "TAINT_RETRY_PERIOD=200ms")
			p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-a"))
			if removal {
				if err := c.admin.AppsV1().DaemonSets(ns).Delete(ctx, c.ds.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			p.stop(t)
			nd, err = c.admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ours, others int
			for _, tn := range nd.Spec.Taints {
				switch tn.Key {
				case "cni.istio.io/not-ready":
					ours++
				case other.Key:
					others++
				}
			}
			if others != 1 {
				t.Errorf("node-a taints %v: the other taint was touched", nd.Spec.Taints)
			}
			if removal {
				p.waitLog(t, "the agent said it removed the taint", `node readiness taint removed: no agent will run on this node again`)
				if ours != 0 {
					t.Errorf("node-a taints %v after the agent left for good: nothing will remove cni.istio.io/not-ready", nd.Spec.Taints)
				}
			} else if ours != 1 {
				t.Errorf("node-a taints %v after a restart: the taint is the leader's to lift", nd.Spec.Taints)
			}
		})
	}
}

// TestAgentKeepsThePluginWhenItsPodIsForceDeleted: the agent's pod is force-deleted
// (kubectl delete pod --force --grace-period=0, as done to a pod stuck
// terminating) while its DaemonSet still runs on the node, whose controller starts
// a new agent pod there at once. The kubelet then SIGTERMs the old agent, whose own
// projected token died with its pod (401). The plugin's token (another
// ServiceAccount's, bound to the node) is still accepted, so the chart is still
// installed: the entry, binaries and kubeconfig stay for the pods that keep
// arriving, as on any restart.
func TestAgentKeepsThePluginWhenItsPodIsForceDeleted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	pod := c.agentPod(t, ctx, "istio-cni-node-a")
	p := c.start(t, pod)
	if err := c.admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	own := c.agentClient(t)
	eventually(t, 20*time.Second, "the force-deleted pod's own token is refused", func() bool {
		_, err := own.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return apierrors.IsUnauthorized(err)
	})
	p.stop(t) // the kubelet's SIGTERM
	if conf, bin, kc := c.n.installed(); !conf || !bin || !kc {
		t.Fatalf("a force-deleted agent whose DaemonSet still runs on the node left: config %v, binary %v, kubeconfig %v; want all kept", conf, bin, kc)
	}
	p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*refuses this agent's identity.*not the plugin's \(HTTP 404`)
}

// canaryDaemonSet creates a canary DaemonSet of the agent beside the chart's (another
// image, the agent's labels and one of its own, the chart's ServiceAccount, as one
// copies the chart's to try an image on some nodes) and makes it the DaemonSet of
// the agent pods c creates.
func (c *exitCluster) canaryDaemonSet(t *testing.T, ctx context.Context) *appsv1.DaemonSet {
	t.Helper()
	canary := c.ds.DeepCopy()
	canary.ObjectMeta = metav1.ObjectMeta{Name: "istio-cni-node-canary", Namespace: ns}
	labels := map[string]string{"k8s-app": "istio-cni-node", "track": "canary"}
	canary.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	canary.Spec.Template.Labels = labels
	canary.Spec.Template.Spec.Containers[0].Image = "install-cni:canary"
	canary, err := c.admin.AppsV1().DaemonSets(ns).Create(ctx, canary, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.ds = canary
	return canary
}

// TestACanaryDaemonSetsAgentKeepsThePluginAcrossARestart: the agent of a canary
// DaemonSet (not named istio-cni-node) restarts while its DaemonSet still runs on
// the node. It reads its own DaemonSet with the chart's grants, as the main
// DaemonSet's agent does, and keeps the plugin. (When the chart granted only the
// DaemonSet istio-cni-node, the read was refused, the 403 taken for helm uninstall,
// and every exit of a canary's agent uninstalled the plugin.)
func TestACanaryDaemonSetsAgentKeepsThePluginAcrossARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	c.canaryDaemonSet(t, ctx)
	p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-canary-a"))
	p.stop(t)
	if conf, bin, kc := c.n.installed(); !conf || !bin || !kc {
		t.Errorf("the canary's agent restarting left: config %v, binary %v, kubeconfig %v; want all kept", conf, bin, kc)
	}
	p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*DaemonSet `+ns+`/istio-cni-node-canary still runs on node node-a`)
	if strings.Contains(p.stderr.String(), "exit decision is not granted") {
		t.Errorf("the agent warned of a grant the chart lacks:\n%s", p.stderr.String())
	}
}

// TestAgentWhoseCanaryDaemonSetIsDeletedKeepsThePluginForTheMainDaemonSetsAgent: a
// canary DaemonSet of the agent runs beside the main one on node-a and is deleted.
// Its agent gets SIGTERM with its own DaemonSet gone, but the main DaemonSet still
// runs an agent on the node, which needs the entry, the binary and the kubeconfig:
// the taint controller counts that node as one an agent runs on
// (daemonset.AgentOn), and so must the exit decision. Removed, pods starting until
// the main agent puts them back would not be redirected. The canary's agent runs as
// the chart's ServiceAccount with the chart's default grants (no taint): listing the
// DaemonSets is among them.
func TestAgentWhoseCanaryDaemonSetIsDeletedKeepsThePluginForTheMainDaemonSetsAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	canary := c.canaryDaemonSet(t, ctx)
	p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-canary-a"))
	if err := c.admin.AppsV1().DaemonSets(ns).Delete(ctx, canary.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p.stop(t)
	if conf, bin, kc := c.n.installed(); !conf || !bin || !kc {
		t.Errorf("the canary's agent left: config %v, binary %v, kubeconfig %v; want all kept for the main DaemonSet's agent", conf, bin, kc)
	}
	p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*istio-cni-node-canary is deleted, but DaemonSet `+ns+`/istio-cni-node still runs an agent on node node-a`)
}

// TestAnAgentNotGrantedAReadOfTheExitDecisionWarnsAtStartAndNamesItOnExit: a
// canary DaemonSet's agent under the Role an earlier chart gave (get of the
// DaemonSet istio-cni-node only). At start it warns of each read the exit decision
// would be refused, as the rule to grant; on exit the refusal is taken for helm
// uninstall, as the chart grants every read, and the reason names the read.
func TestAnAgentNotGrantedAReadOfTheExitDecisionWarnsAtStartAndNamesItOnExit(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := newExitCluster(t, ctx)
	role, err := c.admin.RbacV1().Roles(ns).Get(ctx, "istio-cni-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{"istio-cni-node"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"istio-cni-plugin"}, Verbs: []string{"create"}},
	}
	if _, err := c.admin.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.canaryDaemonSet(t, ctx)
	pod := c.agentPod(t, ctx, "istio-cni-node-canary-a")
	agent := c.agentClient(t)
	eventually(t, 20*time.Second, "the earlier Role is in force", func() bool {
		_, err := agent.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{})
		return apierrors.IsForbidden(err)
	})
	p := c.start(t, pod)
	for _, missing := range []string{"get daemonsets.apps istio-cni-node-canary in namespace " + ns, "list daemonsets.apps in namespace " + ns} {
		p.waitLog(t, "the agent warned of "+missing, `WARN.*exit decision is not granted a read it makes.*missing="`+missing+`"`)
	}
	if strings.Contains(p.stderr.String(), `missing="get nodes`) {
		t.Errorf("the agent warned of the node's read, which the chart grants:\n%s", p.stderr.String())
	}
	p.stop(t)
	p.waitLog(t, "the agent named the read refused", `uninstalling.*forbids this agent to get daemonsets.apps istio-cni-node-canary in namespace `+ns+` \(HTTP 403 Forbidden\): taken for helm uninstall`)
	if conf, _, kc := c.n.installed(); conf || kc {
		t.Errorf("after a refused read: config %v, kubeconfig %v; want both removed, as on helm uninstall", conf, kc)
	}
}

// TestTheExitStaysWithinTheGracePeriodWhenTheAPIServerStopsAnswering: the agent
// leads the node readiness taint (it holds the Lease) and knows its DaemonSet; then
// the API server stops answering (the proxy between them stalls: no refusal, no
// reply). On SIGTERM the taint controller cannot release its Lease and the exit
// decision gets no answer. The agent waits for each at most its bound, both at
// once, and exits within the chart's grace period (after which the kubelet kills
// it), keeping the plugin as for any exit the API server does not answer, and
// saying why.
func TestTheExitStaysWithinTheGracePeriodWhenTheAPIServerStopsAnswering(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	grace := chartGracePeriod(t)
	c := newExitCluster(t, ctx, taintRules...)
	u, err := url.Parse(c.cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	proxy := silent.StallingProxy(t, u.Host)
	_, port, _ := net.SplitHostPort(proxy.Addr.String())
	c.env = append(c.env, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+port,
		"TAINT_ENABLED=true", "TAINT_LEASE_DURATION=20s", "TAINT_RENEW_DEADLINE=15s", "TAINT_RETRY_PERIOD=200ms")
	p := c.start(t, c.agentPod(t, ctx, "istio-cni-node-a"))
	eventually(t, 20*time.Second, "the agent leads the taint", func() bool {
		l, err := c.admin.CoordinationV1().Leases(ns).Get(ctx, "istio-cni-taint", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "istio-cni-node-a"
	})
	proxy.Stall()
	start := time.Now()
	p.stop(t)
	if took := time.Since(start); took >= grace {
		t.Errorf("the exit took %s, want it within the chart's grace period, %s (ExitBound %s)", took, grace, ExitBound)
	}
	p.waitLog(t, "the agent said why it kept the plugin", `exiting with the plugin installed.*cannot read DaemonSet `+ns+`/istio-cni-node`)
	if conf, bin, kc := c.n.installed(); !conf || !bin || !kc {
		t.Errorf("after an exit the API server did not answer: config %v, binary %v, kubeconfig %v; want all kept", conf, bin, kc)
	}
}
