package nodee2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// deployment runs replicas of the meshed pod with the validation init container.
func deployment(t testing.TB, namespace, name string, replicas int32, edits ...func(*corev1.Pod) *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := meshnode.EnsureNamespace(ctx, theNode, namespace); err != nil {
		t.Fatal(err)
	}
	pod := meshnode.WithValidation(meshnode.MeshedPod(namespace, name))
	for _, edit := range edits {
		pod = edit(pod)
	}
	pod.Labels["app"] = name
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec},
		},
	}
	d.Spec.Template.Namespace, d.Spec.Template.Name = "", ""
	if _, err := theNode.Client().AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		theNode.Client().AppsV1().Deployments(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		pods, _ := theNode.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
		var list []*corev1.Pod
		for i := range pods.Items {
			p := &pods.Items[i]
			theNode.Client().CoreV1().Pods(namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			list = append(list, p)
		}
		waitPodsGone(t, list)
	})
}

// readyPods waits until the deployment's pods number want and are all Ready.
func readyPods(t testing.TB, namespace, name string, want int, timeout time.Duration) []*corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		pods, err := theNode.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
		if err == nil {
			var ready []*corev1.Pod
			last = ""
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp != nil {
					continue
				}
				if podIsReady(p) {
					ready = append(ready, p)
				} else {
					last += fmt.Sprintf(" %s(%s)", p.Name, p.Status.Phase)
				}
			}
			if len(ready) == want && last == "" {
				return ready
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("after %s: %s/%s has not %d Ready pods; not ready:%s", timeout, namespace, name, want, last)
	return nil
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// A meshed pod that started while the plugin was not on the node fails its
// validation init container (exit 126); once the chart is installed, the agent's
// repair controller deletes it, its Deployment recreates it, and the new pod is
// captured and passes validation.
// waitValidationFailed waits for a pod of deployment name whose istio-validation
// init container exited 126 (its traffic is not redirected) and returns it.
func waitValidationFailed(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var broken *corev1.Pod
	waitFor(t, "the "+name+" pod's validation fails with exit 126", 60*time.Second, func() bool {
		pods, err := theNode.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			for _, st := range pods.Items[i].Status.InitContainerStatuses {
				for _, term := range []*corev1.ContainerStateTerminated{st.State.Terminated, st.LastTerminationState.Terminated} {
					if term != nil && term.ExitCode == 126 {
						broken = &pods.Items[i]
						return true
					}
				}
			}
		}
		return false
	})
	return broken
}

func TestAPodStartedBeforeTheAgentIsRepaired(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	deployment(t, "early", "early", 1)

	broken := waitValidationFailed(t, "early", "early")
	t.Logf("pod %s started unredirected: its validation failed", broken.Name)

	install(t, s, values(t))
	fixed := readyPods(t, "early", "early", 1, 90*time.Second)[0]
	if fixed.UID == broken.UID {
		t.Fatalf("pod %s became Ready without being repaired", fixed.Name)
	}
	if _, err := theNode.Client().CoreV1().Pods("early").Get(ctx, broken.Name, metav1.GetOptions{}); err == nil {
		if p, _ := theNode.Client().CoreV1().Pods("early").Get(ctx, broken.Name, metav1.GetOptions{}); p != nil && p.UID == broken.UID && p.DeletionTimestamp == nil {
			t.Errorf("the broken pod %s is still there", broken.Name)
		}
	}
	rules, err := s.ShowRules(ctx, fixed)
	if err != nil {
		t.Fatal(err)
	}
	if !meshnode.Captured(rules) {
		t.Errorf("the recreated pod %s is not captured:\n%s", fixed.Name, rules)
	}
	// (A pod calling its own IP is not captured, as in Istio: the client is another pod.)
	client := createPods(t, meshnode.MeshedPod("early", "client"))[0]
	checkCapturedTraffic(t, s, client, fixed)
}

// The agent restarted while meshed pods start: every pod ends up captured (a pod
// that started in the gap fails validation and is repaired), and the chain has
// istio-cni exactly once.
func TestAgentRestartedWhilePodsStartEveryMeshedPodEndsUpCaptured(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	agent := install(t, s, values(t))
	deployment(t, "restart", "burst", 0)

	// Every pod the Deployment ever makes: more than 6 means some started in the
	// gap and were repaired (deleted and made again).
	w, err := theNode.Client().CoreV1().Pods("restart").Watch(ctx, metav1.ListOptions{LabelSelector: "app=burst"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := map[types.UID]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				seen[p.UID] = true
			}
		}
	}()
	if err := theNode.Client().CoreV1().Pods(meshnode.Namespace).Delete(ctx, agent.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"spec":{"replicas":6}}`)
	if _, err := theNode.Client().AppsV1().Deployments("restart").Patch(ctx, "burst", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := readyPods(t, "restart", "burst", 6, 120*time.Second)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := meshnode.WaitAgentReady(wctx, theNode, meshnode.Namespace); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		rules, err := s.ShowRules(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !meshnode.Captured(rules) {
			t.Errorf("pod %s is Ready but not captured:\n%s", p.Name, rules)
		}
	}
	w.Stop()
	<-done
	t.Logf("the Deployment made %d pods for 6 replicas (%d repaired)", len(seen), len(seen)-6)
	var count int
	for _, typ := range conflistTypes(t) {
		if typ == "istio-cni" {
			count++
		}
	}
	if count != 1 {
		t.Errorf("istio-cni is %d times in the chain: %v", count, conflistTypes(t))
	}
}
