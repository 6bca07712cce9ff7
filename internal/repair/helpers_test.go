package repair

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/pods"
)

const testNS = "app"

// RBAC rules per feature, exactly as README.md lists them. Tests run the
// controller with a ServiceAccount holding only these, so a missing or extra need
// shows up as a failure.
var (
	rbacWatchPods = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}
	rbacEvents    = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
	rbacDeletePod = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"delete"}}
	rbacLabelPod  = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}
)

func rulesFor(cfg Config) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{rbacWatchPods, rbacEvents}
	if cfg.DeletePods {
		rules = append(rules, rbacDeletePod)
	}
	if cfg.LabelPods || cfg.RepairPods || cfg.MultusNetwork != "" {
		rules = append(rules, rbacLabelPod)
	}
	return rules
}

func startControlPlane(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	return controlplane.StartForTestWithNamespaces(t, controlplane.Options{}, testNS)
}

// clientWithRules is a client for a ServiceAccount that holds exactly rules.
func clientWithRules(t testing.TB, cp *controlplane.ControlPlane, name string, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	cfg := cp.ServiceAccountConfigForTest(t, "istio-system", name, rules)
	cfg.QPS, cfg.Burst = 100, 200
	return controlplane.ClientForTest(t, cfg)
}

type podOpt = pods.Option

func withoutSidecarStatus(p *corev1.Pod) { delete(p.Annotations, DefaultSidecarAnnotation) }
func withLabel(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[k] = v
	}
}
func withRestartPolicy(r corev1.RestartPolicy) podOpt {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = r }
}

// injectedPod is a pod as Istio's injector shapes it with the CNI enabled: the
// istio-validation init container and an istio-proxy sidecar.
func injectedPod(name, node string, opts ...podOpt) *corev1.Pod {
	return pods.Injected(testNS, name, node, opts...)
}

func createPod(t testing.TB, c kubernetes.Interface, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	return got
}

// setValidation plays the kubelet: it reports the validation init container as
// terminated with code (and message) and the pod's address.
func setValidation(t testing.TB, c kubernetes.Interface, p *corev1.Pod, ip string, code int32, msg string) *corev1.Pod {
	t.Helper()
	p = p.DeepCopy()
	reason := "Error"
	if code == 0 {
		reason = "Completed"
	}
	p.Status = corev1.PodStatus{
		Phase:  corev1.PodPending,
		PodIP:  ip,
		PodIPs: []corev1.PodIP{{IP: ip}},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name:  DefaultInitContainerName,
			Image: "proxyv2",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: code, Reason: reason, Message: msg,
				StartedAt: metav1.Now(), FinishedAt: metav1.Now(),
			}},
		}},
	}
	got, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status of pod %s: %v", p.Name, err)
	}
	return got
}

func testConfig(node string) Config {
	c := DefaultConfig()
	c.NodeName = node
	c.RetryBase = 20 * time.Millisecond
	c.RetryMax = 200 * time.Millisecond
	return c
}

// runController starts a controller and waits until it has listed its node's pods.
func runController(t testing.TB, cfg Config, client kubernetes.Interface, deps Deps) *Controller {
	t.Helper()
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	c, err := New(cfg, client, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return c.HasSynced(), nil }); err != nil {
		t.Fatalf("controller never synced: %v", err)
	}
	return c
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

// podDeleted: gone, or marked for deletion (with no kubelet to confirm it, a pod
// bound to a node keeps its deletionTimestamp until its grace period ends).
func podDeleted(c kubernetes.Interface, name string) func() (bool, error) {
	return func() (bool, error) {
		p, err := c.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && p.DeletionTimestamp != nil, err
	}
}

// eventsFor returns "Type Reason: message" of every event on the pod.
func eventsFor(t testing.TB, c kubernetes.Interface, name string) []string {
	t.Helper()
	list, err := c.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	return out
}

func waitEvent(t testing.TB, c kubernetes.Interface, pod, reason string) string {
	t.Helper()
	var found string
	waitFor(t, "event "+reason+" on pod "+pod, 20*time.Second, func() (bool, error) {
		for _, e := range eventsFor(t, c, pod) {
			if strings.Contains(e, " "+reason+": ") {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// wantCount waits for a controller counter to reach want, then checks it is not
// above it. The API server shows an effect (a pod deleted, a label set) just
// before the controller reads its answer and counts it, so reading the counter
// once right after seeing the effect would race.
func wantCount(t testing.TB, what string, count func() uint64, want uint64) {
	t.Helper()
	waitFor(t, what+" counted", 10*time.Second, func() (bool, error) { return count() >= want, nil })
	if got := count(); got != want {
		t.Errorf("%s = %d, want %d", what, got, want)
	}
}
