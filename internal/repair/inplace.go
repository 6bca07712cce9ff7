package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

// repairInPlace programs the capture into the running pod's network namespace.
// done means the pod is repaired (now or before). notApplicable explains why an
// in-place repair cannot help this pod, with no error: retrying would not change
// the answer. err is a failure worth retrying.
//
// What happens next is the kubelet's: the validation container is crash-looping,
// its next restart finds the traffic redirected and succeeds, and the pod's other
// containers start. This is what Istio's repair does too; the pod is not restarted.
func (c *Controller) repairInPlace(ctx context.Context, pod *corev1.Pod, why string) (done bool, notApplicable string, err error) {
	key := cache.MetaObjectToName(pod).String()
	failure := repairedFailure{uid: pod.UID, run: failureID(&c.cfg, pod)}
	c.mu.Lock()
	seen, ok := c.repaired[key]
	c.mu.Unlock()
	if ok && seen == failure {
		// The kubelet has not run the validation since (or it is running): its
		// next run finds the rules. A run that fails after the repair is another
		// failure, repaired again: a new sandbox set up meanwhile without the
		// plugin, or rules removed since.
		return true, "", nil
	}
	if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
		// Its init container never runs again: programming the namespace now would
		// leave the pod failed anyway.
		c.metrics.count(ActionRepair, ResultSkip)
		return false, "the pod's restartPolicy is Never, so its validation will not run again", nil
	}
	kp, err := KubePod(pod)
	if err != nil {
		return false, "", err
	}
	if kp.Ended() {
		// Evicted, say, or a node shutdown: the namespace search would find and
		// program the pod that holds its address now.
		c.metrics.count(ActionRepair, ResultSkip)
		return false, fmt.Sprintf("the pod has ended (phase %s), so its containers will not run again and its address may be another pod's by now", pod.Status.Phase), nil
	}
	// No namespace: only a pod without a sidecar needs it (for ambient mode's label),
	// and such a pod has no istio-validation to fail; were one to come here, its
	// decision (need-namespace) is not Redirect, so it is not repaired: the plugin
	// would not capture it either.
	pp, err := plugin.PlanFor(plugin.ArgsFor(kp), c.inPlace.Plugin, kp, nil, plugin.Sandbox{})
	if err != nil {
		c.metrics.count(ActionRepair, ResultSkip)
		return false, "its capture cannot be built: " + err.Error(), nil
	}
	if pp.Decision.Verdict != plugin.Redirect {
		c.metrics.count(ActionRepair, ResultSkip)
		return false, "the plugin would not capture it (" + pp.Decision.Reason + ")", nil
	}
	plan := pp.Plan

	repairCtx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	c.metrics.NetnsScans.Add(1)
	ns, err := c.inPlace.Finder.Find(repairCtx, kp.IPs())
	if err != nil {
		c.metrics.count(ActionRepair, ResultFail)
		return false, "", fmt.Errorf("repair pod %s in place: %w", key, err)
	}
	defer ns.Close()
	if err := ns.CheckSandboxOf(kp); err != nil {
		c.metrics.count(ActionRepair, ResultFail)
		return false, "", fmt.Errorf("repair pod %s in place: %w; not programmed", key, err)
	}
	b := c.inPlace.Backend
	diffs, err := plugin.ApplyVerifiedAndWarn(repairCtx, c.log.With("pod", key), ns.Path, b, plan)
	if err == nil && len(diffs) > 0 {
		err = fmt.Errorf("rules differ after apply: %s", strings.Join(diffs, "; "))
	}
	if err != nil {
		c.metrics.count(ActionRepair, ResultFail)
		return false, "", fmt.Errorf("repair pod %s in place (namespace %s): %w", key, ns.Source, err)
	}
	c.mu.Lock()
	c.repaired[key] = failure
	c.mu.Unlock()
	c.metrics.count(ActionRepair, ResultSuccess)
	c.log.Info("repaired broken pod in place", "pod", key, "netns", ns.Source, "backend", b.Name(), "reason", why)
	c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonRepairBrokenPod,
		"%s; istio-cni programmed the redirection into its network namespace (%s, %s); the validation passes at its next restart",
		why, ns.Source, b.Name())
	if _, labelled := pod.Labels[c.cfg.LabelKey]; labelled {
		c.unlabel(ctx, pod)
	}
	return true, "", nil
}

// unlabel removes the broken-pod label that an earlier label action set. Failing
// to remove it does not undo the repair, so it is reported, not retried.
func (c *Controller) unlabel(ctx context.Context, pod *corev1.Pod) {
	patch, err := labelPatch(pod.UID, c.cfg.LabelKey, nil)
	if err == nil {
		err = c.bounded(ctx, func(ctx context.Context) error {
			_, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("repaired pod keeps its broken-pod label", "pod", cache.MetaObjectToName(pod).String(), "label", c.cfg.LabelKey, "error", err)
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonRepairBrokenPod, "repaired, but the label %s could not be removed: %v", c.cfg.LabelKey, err)
	}
}

// labelPatch sets (value non-nil) or removes the label, for the pod with uid only:
// a merge patch carrying metadata.uid fails on a pod recreated under the same name.
func labelPatch(uid types.UID, key string, value *string) ([]byte, error) {
	patch := map[string]any{"metadata": map[string]any{
		"uid":    uid,
		"labels": map[string]any{key: value},
	}}
	return json.Marshal(patch)
}

// KubePod gives the plugin its own view of the pod, through the same JSON it
// decodes from the API server.
func KubePod(pod *corev1.Pod) (*kube.Pod, error) {
	data, err := json.Marshal(pod)
	if err != nil {
		return nil, fmt.Errorf("encode pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	kp, err := kube.DecodePod(data)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pod %s/%s", pod.Namespace, pod.Name), err)
	}
	return kp, nil
}
