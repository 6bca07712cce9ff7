package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/istio-cni/istio-cni/internal/daemonset"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/taint"
)

// ExitMode says what the agent does with what it installed when it exits.
type ExitMode string

const (
	// ExitAuto keeps the plugin installed when another agent will take over on this
	// node (a rolling update, a crash, an eviction, the node shutting down) and
	// uninstalls it when none will (helm uninstall, the DaemonSet deleted or no
	// longer targeting the node). It asks the API server; see exitDecision.
	ExitAuto ExitMode = "auto"
	// ExitAlways uninstalls on every exit: Istio's sidecar-mode installer does this,
	// and it leaves a window on every restart in which new pods start without the
	// plugin.
	ExitAlways ExitMode = "always"
	// ExitNever keeps everything on every exit; removing it is left to the operator
	// (istio-cni-doctor lists what is installed).
	ExitNever ExitMode = "never"
)

func parseExitMode(v string) (ExitMode, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "auto", "":
		return ExitAuto, nil
	case "always", "true":
		return ExitAlways, nil
	case "never", "false":
		return ExitNever, nil
	}
	return "", fmt.Errorf("%q is not auto, always or never (true and false stand for always and never)", v)
}

// ExitLookupBound bounds the API requests behind an exit decision, all of them
// together. They are made while the features stop, which takes no longer
// (controllerStopWait): see ExitBound.
const ExitLookupBound = 3 * time.Second

// ExitPluginIdentityBound bounds the request that, when the API server refuses this
// agent's token (401), asks it with the plugin's kubeconfig instead (see
// decideExit); it is one of the requests ExitLookupBound bounds together.
const ExitPluginIdentityBound = time.Second

// ExitUntaintBound bounds the removal of the node's readiness taint on a removal
// (read the node, patch it; again on a conflict), after the decision.
const ExitUntaintBound = time.Second

// ExitBound bounds what the agent waits for between SIGTERM and removing the files
// on a removal: the exit decision's requests (ExitLookupBound), made while the
// features stop (controllerStopWait, no longer), then the taint's removal
// (ExitUntaintBound). The chart's terminationGracePeriodSeconds (5 s) leaves 1 s
// more for the files; the kubelet kills the agent at its end, and a decision cut
// short uninstalls nothing. What follows the files (the HTTP servers' shutdown,
// at most 2 s) loses nothing when it is cut short.
const ExitBound = ExitLookupBound + ExitUntaintBound

// exitClient is what the exit decision reads.
type exitClient interface {
	getPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	getDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error)
	getNode(ctx context.Context, name string) (*corev1.Node, error)
	listDaemonSets(ctx context.Context, namespace string) ([]appsv1.DaemonSet, error)
}

func (c *apiClient) getPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.core.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c *apiClient) getDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	return c.apps.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c *apiClient) getNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.core.Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (c *apiClient) listDaemonSets(ctx context.Context, namespace string) ([]appsv1.DaemonSet, error) {
	l, err := c.apps.DaemonSets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// pluginIdentity asks the API server for this agent's pod with the plugin's
// credential rather than this agent's: with PLUGIN_SERVICE_ACCOUNT, a token of that
// account bound to the node, which outlives this agent's pod. Its error is the
// answer (nil: the pod was read); errNoPluginIdentity when there is no such
// credential to ask with.
type pluginIdentity func(ctx context.Context) error

// errNoPluginIdentity: the plugin's kubeconfig cannot be read or used.
var errNoPluginIdentity = errors.New("no plugin kubeconfig to ask with")

// pluginIdentity is the exit decision's plugin credential, read from the plugin's
// kubeconfig in the run dir (what the plugin itself uses) with the plugin's own
// client; nil without PLUGIN_SERVICE_ACCOUNT, where that kubeconfig holds this
// agent's own token. Each request is bounded by ExitPluginIdentityBound.
func (a *agent) pluginIdentity() pluginIdentity {
	if a.s.PluginServiceAccount == "" {
		return nil
	}
	return func(ctx context.Context) error {
		path := a.s.KubeconfigPath()
		kc, err := kube.LoadKubeconfig(path)
		if err != nil {
			return fmt.Errorf("%w: %w", errNoPluginIdentity, err)
		}
		c, err := kube.NewClient(kc, ExitPluginIdentityBound)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", errNoPluginIdentity, path, err)
		}
		var pod kube.Pod
		err = c.Get(ctx, kube.PodPath(a.s.PodNamespace, a.s.PodName), &pod)
		var st *kube.StatusError
		if errors.As(err, &st) {
			// As client-go reports it, for the decision's checks and its log.
			return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: int32(st.Code),
				Reason: metav1.StatusReason(st.Reason), Message: st.Message}}
		}
		return err
	}
}

// exitRead is one request of the exit decision, spelt as the RBAC rule that grants
// it: a refusal (403) names it.
type exitRead struct {
	verb, resource, name, namespace string // resource with its API group, as kubectl spells it
}

func (r exitRead) String() string {
	s := r.verb + " " + r.resource
	if r.name != "" {
		s += " " + r.name
	}
	if r.namespace != "" {
		s += " in namespace " + r.namespace
	}
	return s
}

func podRead(namespace, name string) exitRead { return exitRead{"get", "pods", name, namespace} }

func daemonSetRead(namespace, name string) exitRead {
	return exitRead{"get", "daemonsets.apps", name, namespace}
}

func nodeRead(name string) exitRead { return exitRead{"get", "nodes", name, ""} }

func daemonSetsList(namespace string) exitRead {
	return exitRead{"list", "daemonsets.apps", "", namespace}
}

// exitDecision is whether to uninstall on exit, and why (logged).
type exitDecision struct {
	Uninstall bool
	// NoAgentFollows: the API server says no agent will run on this node again (the
	// DaemonSet is gone or no longer runs here), as opposed to uninstalling because
	// UNINSTALL_ON_EXIT=always. The node's readiness taint then goes too.
	NoAgentFollows bool
	Reason         string
}

// decideExit tells a restart from a removal. The agent is going away; the question
// is whether another agent will run on this node. Only the API server knows:
//
//   - this agent's pod names its DaemonSet (the controller owner reference, read at
//     start so that a force-deleted pod still has an answer; owner is nil when it
//     could not be read then);
//   - the DaemonSet is gone or being deleted: removal (helm uninstall, kubectl delete);
//   - the DaemonSet's pod template no longer fits the node (node selector, required
//     node affinity, a NoExecute taint it does not tolerate, as daemonset.Excludes
//     counts them for a pod already there: never the node readiness taint,
//     readinessTaint; a NoSchedule taint keeps a new agent off but not this pod's
//     restarted container): removal, the DaemonSet controller will not keep an
//     agent here;
//   - the node is gone: removal;
//   - but while another DaemonSet of the agent in namespace (its pod template
//     matches agentSelector, TAINT_AGENT_LABEL_SELECTOR) still runs on the node, as
//     daemonset.AgentOn answers it for the node readiness controller, its agent
//     needs the plugin: a canary DaemonSet deleted beside the main one is no
//     removal;
//   - otherwise: restart (a rolling update, a crash, an eviction, the node shutting
//     down), the entry, binaries and kubeconfig stay so that pods keep being captured
//     while no agent runs.
//
// A 403 on any of these reads is a removal: the chart grants every one of them
// (get pods and nodes; in the release namespace get and list daemonsets, by any
// name, so that a canary DaemonSet's agent reads its own), and helm uninstall
// deletes the grants right after the DaemonSet, so by the time this agent is asked
// to stop they may be gone. The reason names the read refused, as the RBAC rule
// that grants it: an agent deployed without it uninstalls on every exit, and
// learnOwner warns of that at start. Keeping instead would be the worse mistake
// after a real uninstall: the entry would stay with a kubeconfig whose
// ServiceAccount helm deletes, and every ADD on the node would fail until someone
// removed the entry by hand; a removal that was a restart costs the seconds until
// the next agent installs again, as every restart does with Istio's sidecar-mode
// installer.
//
// A 401 is also all that is left of a pod deleted at once (kubectl delete pod
// --force --grace-period=0) while its DaemonSet still runs here: its projected
// token is bound to it. So a 401 is asked again with plugin, the plugin's
// credential, whose ServiceAccount helm uninstall deletes too but which no pod
// deletion touches: refused as well (401, or 403: helm deletes the grants before
// the ServiceAccounts, and the chart grants the plugin every pod's get), it is a
// removal; answered (the pod, or 404), only this agent's pod is gone and the
// install stays. Without plugin (nil: the plugin uses this agent's own token) or
// a kubeconfig to ask with, a 401 is a removal.
//
// Any other failure (timeout, refused, 5xx) keeps everything: a node left with the
// plugin installed keeps capturing pods, a node left without it does not; helm
// uninstall has just been answered by the API server, a node that cannot reach it
// now is more likely in an outage than being uninstalled.
func decideExit(ctx context.Context, c exitClient, plugin pluginIdentity, o owner, namespace, podName, nodeName, readinessTaint, agentSelector string) exitDecision {
	keep := func(format string, args ...any) exitDecision {
		return exitDecision{Reason: fmt.Sprintf(format, args...)}
	}
	remove := func(format string, args ...any) exitDecision {
		return exitDecision{Uninstall: true, NoAgentFollows: true, Reason: fmt.Sprintf(format, args...)}
	}
	forbidden := func(prefix string, r exitRead, err error) exitDecision {
		return remove("%sthe API server forbids this agent to %s (%v): taken for helm uninstall, which deletes the chart's grants with the DaemonSet "+
			"(the chart grants every read of the exit decision; an agent not granted this one uninstalls on every exit)", prefix, r, shortAPIError(err))
	}
	refused := func(r exitRead, err error) exitDecision {
		if apierrors.IsForbidden(err) {
			return forbidden("", r, err)
		}
		if plugin == nil {
			return remove("the API server refuses this agent's identity (%v): the chart is being uninstalled", shortAPIError(err))
		}
		perr := plugin(ctx)
		var st apierrors.APIStatus
		switch {
		case errors.Is(perr, errNoPluginIdentity):
			return remove("the API server refuses this agent's identity (%v), and the plugin has none other to ask with (%v): the chart is being uninstalled",
				shortAPIError(err), perr)
		case identityGone(perr):
			return remove("the API server refuses this agent's identity (%v) and the plugin's (%v): the chart is being uninstalled",
				shortAPIError(err), shortAPIError(perr))
		case perr == nil || errors.As(perr, &st):
			answer := "HTTP 200"
			if perr != nil {
				answer = shortAPIError(perr).Error()
			}
			return keep("the API server refuses this agent's identity (%v) but not the plugin's (%s): this agent's pod was deleted, its token with it, "+
				"and the chart is still installed; keeping the plugin installed", shortAPIError(err), answer)
		default:
			return keep("the API server refuses this agent's identity (%v), and asking with the plugin's failed (%v): keeping the plugin installed",
				shortAPIError(err), perr)
		}
	}
	ds := o.daemonSet
	if !o.known {
		// Not learnt at start (the API server did not answer then): ask now.
		pod, err := c.getPod(ctx, namespace, podName)
		switch {
		case identityGone(err):
			return refused(podRead(namespace, podName), err)
		case err != nil:
			return keep("cannot read this agent's pod %s/%s (%v): keeping the plugin installed", namespace, podName, shortAPIError(err))
		}
		ds = daemonset.ControllerOf(pod)
	}
	// gone says why this agent's own DaemonSet will not run another agent here.
	var gone string
	var set *appsv1.DaemonSet
	if ds == nil {
		gone = fmt.Sprintf("pod %s/%s is not run by a DaemonSet: nothing will start another agent on this node", namespace, podName)
	} else {
		var err error
		set, err = c.getDaemonSet(ctx, namespace, ds.Name)
		switch {
		case identityGone(err):
			return refused(daemonSetRead(namespace, ds.Name), err)
		case apierrors.IsNotFound(err):
			gone = fmt.Sprintf("DaemonSet %s/%s is deleted", namespace, ds.Name)
		case err != nil:
			return keep("cannot read DaemonSet %s/%s (%v): keeping the plugin installed", namespace, ds.Name, shortAPIError(err))
		case set.DeletionTimestamp != nil:
			gone = fmt.Sprintf("DaemonSet %s/%s is being deleted", namespace, ds.Name)
		}
	}
	node, err := c.getNode(ctx, nodeName)
	switch {
	case identityGone(err):
		return refused(nodeRead(nodeName), err)
	case apierrors.IsNotFound(err):
		return remove("node %s is deleted", nodeName)
	case err != nil:
		return keep("cannot read node %s (%v): keeping the plugin installed", nodeName, shortAPIError(err))
	}
	// Asked as for a pod of the DaemonSet already on the node (running): a NoSchedule
	// taint the template does not tolerate keeps a new agent off the node, but
	// SIGTERM also comes with a restart of this pod's container (a failed liveness
	// probe), which stays: uninstalling then would let pods start uncaptured until
	// it reinstalls. Kept, a node whose agent does not come back keeps capturing
	// while the plugin's token lives, and then fails its ADDs closed.
	if gone == "" {
		if why := daemonset.Excludes(&set.Spec.Template.Spec, node, true, readinessTaint); why != "" {
			gone = fmt.Sprintf("DaemonSet %s/%s no longer runs on node %s: %s", namespace, ds.Name, nodeName, why)
		}
	}
	if gone != "" {
		agents, err := labels.Parse(agentSelector)
		if err != nil {
			// Checked at start only with the taint controller on.
			return remove("%s (no other DaemonSet of the agent asked: %s %q: %v)", gone, taint.EnvAgentSelector, agentSelector, err)
		}
		sets, err := c.listDaemonSets(ctx, namespace)
		switch {
		case apierrors.IsForbidden(err):
			return forbidden(gone+"; ", daemonSetsList(namespace), err)
		case apierrors.IsUnauthorized(err):
			return remove("%s; the API server refuses this agent's identity (%v) to list the DaemonSets of %s", gone, shortAPIError(err), namespace)
		case err != nil:
			return keep("%s, and listing the DaemonSets of %s failed (%v): keeping the plugin installed", gone, namespace, shortAPIError(err))
		}
		others := make([]*appsv1.DaemonSet, len(sets))
		for i := range sets {
			others[i] = &sets[i]
		}
		if other := daemonset.AgentOn(others, agents, node, true, readinessTaint); other != "" {
			return keep("%s, but DaemonSet %s still runs an agent on node %s, which needs the plugin: it stays installed", gone, other, nodeName)
		}
		return remove("%s", gone)
	}
	return keep("DaemonSet %s/%s still runs on node %s: a new agent takes over, the plugin stays installed", namespace, ds.Name, nodeName)
}

// checkExitGrants makes, once, each read the exit decision may make on exit but
// this agent's pod (read already), and warns of each the API server forbids: on
// exit a 403 is taken for helm uninstall (decideExit), so an agent deployed
// without the grant uninstalls when it should keep, and pods that start on the
// node before the next agent has installed the plugin again are not redirected.
// Each read within ExitLookupBound; an answer other than 403 says nothing here.
func (a *agent) checkExitGrants(ctx context.Context, client *apiClient, o owner) {
	ns := a.s.PodNamespace
	type check struct {
		read exitRead
		do   func(context.Context) error
		// then is what the exit does without the grant.
		then string
	}
	const everyExit = "every exit of this agent uninstalls the plugin, a restart or an upgrade too"
	var checks []check
	if o.daemonSet != nil {
		checks = append(checks, check{daemonSetRead(ns, o.daemonSet.Name), func(ctx context.Context) error {
			_, err := client.getDaemonSet(ctx, ns, o.daemonSet.Name)
			return err
		}, everyExit})
	}
	checks = append(checks,
		check{nodeRead(a.s.NodeName), func(ctx context.Context) error {
			_, err := client.getNode(ctx, a.s.NodeName)
			return err
		}, everyExit},
		check{daemonSetsList(ns), func(ctx context.Context) error {
			_, err := client.apps.DaemonSets(ns).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}, "when this agent's DaemonSet leaves the node, the plugin is uninstalled even while another DaemonSet of the agent (a canary, the main one) runs an agent there"})
	for _, c := range checks {
		rctx, cancel := context.WithTimeout(ctx, ExitLookupBound)
		err := c.do(rctx)
		cancel()
		if apierrors.IsForbidden(err) {
			a.log.Warn("the exit decision is not granted a read it makes: on exit a refusal is taken for helm uninstall (which deletes the chart's grants), so "+
				c.then+"; grant it (the chart does, in the release namespace's Role and the ClusterRole)",
				"missing", c.read.String(), "error", shortAPIError(err))
		}
	}
}

// owner is the DaemonSet that runs this agent, as read at start.
type owner struct {
	// known says the agent's pod was read; daemonSet is then its controller, nil
	// when that is not a DaemonSet.
	known     bool
	daemonSet *metav1.OwnerReference
}

// identityGone reports a 401 or 403: the ServiceAccount, its token or its grants
// are gone.
func identityGone(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}

// shortAPIError is err without client-go's long prefix for a status error.
func shortAPIError(err error) error {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		return fmt.Errorf("HTTP %d %s", s.Code, s.Reason)
	}
	return err
}
