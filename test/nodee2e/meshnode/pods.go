package meshnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/node"
)

// ProxyUID is the uid of the istio-proxy container, whose traffic the capture lets out.
const ProxyUID = 1337

// sidecarStatus is the sidecar.istio.io/status annotation the injector writes; the
// plugin redirects only pods that carry one.
var sidecarStatus = func() string {
	b, _ := json.Marshal(map[string]any{
		"initContainers":   nil,
		"containers":       []string{"istio-proxy"},
		"volumes":          []string{},
		"imagePullSecrets": nil,
		"revision":         "default",
	})
	return string(b)
}()

// MeshedPod is a pod as Istio's injector (with istio-cni, so no istio-init) leaves
// it: the app container (the stand-in's HTTP server on 8080) and the istio-proxy
// sidecar (the stand-in proxy, uid 1337), with the injector's annotation.
func MeshedPod(namespace, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name,
			Labels:      map[string]string{"app": "demo", "security.istio.io/tlsMode": "istio"},
			Annotations: map[string]string{"sidecar.istio.io/status": sidecarStatus},
		},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           DemoImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"app", "8080"},
				Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			}, {
				Name:            "istio-proxy",
				Image:           DemoImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"proxy", "sidecar"},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:  ptr.To[int64](ProxyUID),
					RunAsGroup: ptr.To[int64](ProxyUID),
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(15021)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// CreatePods creates the pods (and their namespaces) and waits until each is Ready.
func CreatePods(ctx context.Context, n *node.Node, pods ...*corev1.Pod) ([]*corev1.Pod, error) {
	for _, p := range pods {
		if err := EnsureNamespace(ctx, n, p.Namespace); err != nil {
			return nil, err
		}
		if _, err := n.Client().CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	var out []*corev1.Pod
	for _, p := range pods {
		ready, err := WaitPodReady(ctx, n, p.Namespace, p.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, ready)
	}
	return out, nil
}

// EnsureNamespace creates the namespace if needed and waits for its default ServiceAccount.
func EnsureNamespace(ctx context.Context, n *node.Node, name string) error {
	_, err := n.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	// Pods need the namespace's default ServiceAccount, which the controller-manager makes.
	for {
		if _, err := n.Client().CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s: no default ServiceAccount: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitPodReady waits for the pod to be Ready; a pod whose sandbox failed (a CNI
// ADD error) shows in the error with kubelet's events.
func WaitPodReady(ctx context.Context, n *node.Node, namespace, name string) (*corev1.Pod, error) {
	var last string
	for {
		p, err := n.Client().CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if podReady(p) {
				return p, nil
			}
			last = describe(p)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for pod %s/%s to be Ready: %w (last: %s)%s", namespace, name, ctx.Err(), last, events(n, namespace, name))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func events(n *node.Node, namespace, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := n.Client().CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil || len(evs.Items) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; events:")
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// PID is the host pid of a container of the pod (containerd's task), for
// nsenter -t PID -n.
func PID(ctx context.Context, n *node.Node, p *corev1.Pod, container string) (int, error) {
	var id string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return 0, fmt.Errorf("pod %s/%s: no running container %s", p.Namespace, p.Name, container)
	}
	out, err := exec.CommandContext(ctx, n.Ctr(), "-a", n.ContainerdSocket(), "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("ctr tasks ls: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("pod %s/%s: container %s (%s) has no task", p.Namespace, p.Name, container, id)
}

// Rules is iptables-save's output for the pod's network namespace, read from the
// node with nsenter, in the same iptables flavour the plugin uses by default.
func Rules(ctx context.Context, n *node.Node, p *corev1.Pod) (cmdline, out string, err error) {
	pid, err := PID(ctx, n, p, "app")
	if err != nil {
		return "", "", err
	}
	args := []string{"-t", strconv.Itoa(pid), "-n", "iptables-save"}
	cmdline = "nsenter " + strings.Join(args, " ")
	b, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	if err != nil {
		return cmdline, string(b), fmt.Errorf("%s: %w: %s", cmdline, err, b)
	}
	return cmdline, string(b), nil
}

// Captured says whether rules hold Istio's capture chains and the jumps to them
// from the built-in PREROUTING and OUTPUT chains.
func Captured(rules string) bool {
	lines := strings.Split(rules, "\n")
	has := func(pred func(string) bool) bool {
		for _, l := range lines {
			if pred(l) {
				return true
			}
		}
		return false
	}
	for _, chain := range []string{"ISTIO_INBOUND", "ISTIO_OUTPUT", "ISTIO_REDIRECT", "ISTIO_IN_REDIRECT"} {
		if !has(func(l string) bool { return strings.HasPrefix(l, ":"+chain+" ") }) {
			return false
		}
	}
	return has(func(l string) bool {
		return strings.HasPrefix(l, "-A PREROUTING ") && strings.HasSuffix(l, "-j ISTIO_INBOUND")
	}) &&
		has(func(l string) bool {
			return strings.HasPrefix(l, "-A OUTPUT ") && strings.HasSuffix(l, "-j ISTIO_OUTPUT")
		})
}

// Forwarded lists the proxy log's connection lines of one direction ("outbound",
// "inbound"), one original destination each.
func Forwarded(log, direction string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if rest, ok := strings.CutPrefix(l, direction+" "); ok && strings.Contains(rest, " via proxy") {
			out = append(out, strings.Fields(rest)[0])
		}
	}
	return out
}

// DualStack sets ISTIO_DUAL_STACK=true in the pod's istio-proxy container, as
// Istio's injector does in a dual-stack mesh: the plugin then captures IPv6 too.
func DualStack(p *corev1.Pod) *corev1.Pod {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == "istio-proxy" {
			p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: "ISTIO_DUAL_STACK", Value: "true"})
		}
	}
	return p
}

// PodIPv6 is the pod's IPv6 address from status.podIPs, or the zero Addr.
func PodIPv6(p *corev1.Pod) netip.Addr {
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is6() {
			return a
		}
	}
	return netip.Addr{}
}

// HasIstioRules says whether any ISTIO_ chain or rule is present.
func HasIstioRules(rules string) bool { return strings.Contains(rules, "ISTIO_") }

// WithValidation adds Istio's istio-validation init container, as the injector
// writes it for istio-cni: the project's istio-iptables --run-validation as the
// proxy's uid, which exits 126 (what the repair controller looks for) unless the
// pod's traffic is redirected.
func WithValidation(p *corev1.Pod) *corev1.Pod {
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{
		Name:            "istio-validation",
		Image:           DemoImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         []string{"istio-iptables"},
		Args: []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
			"-d", "15090,15021,15020", "--run-validation", "--skip-rule-apply"},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:  ptr.To[int64](ProxyUID),
			RunAsGroup: ptr.To[int64](ProxyUID),
		},
	})
	return p
}
