package meshnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/test/harness/node"
)

// Release and Namespace of the chart's installation.
const (
	Release   = "istio-cni"
	Namespace = "kube-system"
)

// Session runs the commands a user would run against the node, printing each
// ("$ kubectl ...") and its output to Out.
type Session struct {
	Node  *node.Node
	Tools Tools
	Root  string
	Out   io.Writer
	// Env is added to the commands' environment (DOCKER_CONFIG for helm's
	// registry credentials, say).
	Env []string
}

// Sh runs name with args (KUBECONFIG set to the node's), printing the command as a
// user would type it and its output indented.
func (s *Session) Sh(ctx context.Context, name string, args ...string) (string, error) {
	shown := filepath.Base(name)
	fmt.Fprintf(s.Out, "  $ %s %s\n", shown, quoteArgs(args))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(os.Environ(), s.Node.ToolEnv()...), s.Env...)
	cmd.Dir = s.Root
	out, err := cmd.CombinedOutput()
	s.print(string(out))
	if err != nil {
		// The output goes into the error too: a quiet session (Out discarded)
		// otherwise reports a failed command as its exit status alone.
		return string(out), fmt.Errorf("%s %s: %w%s", shown, quoteArgs(args), err, outputTail(out))
	}
	return string(out), nil
}

// outputTailMax bounds the part of a failed command's output its error quotes.
const outputTailMax = 2048

// outputTail is the end of a failed command's output, for its error: at most
// outputTailMax bytes, or "" when there was none.
func outputTail(out []byte) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return ""
	}
	if len(s) > outputTailMax {
		s = "..." + s[len(s)-outputTailMax:]
	}
	return "; output: " + s
}

func (s *Session) print(out string) {
	out = strings.TrimRight(out, "\n")
	if out == "" {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		fmt.Fprintf(s.Out, "    %s\n", line)
	}
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'{}$*") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// Kubectl runs kubectl against the node.
func (s *Session) Kubectl(ctx context.Context, args ...string) (string, error) {
	return s.Sh(ctx, s.Tools.Kubectl, args...)
}

// Install runs helm install with values and waits for the agent pod to be Ready,
// returning how long that took from the start of helm install.
func (s *Session) Install(ctx context.Context, values []string) (time.Duration, *corev1.Pod, error) {
	return s.InstallChart(ctx, "charts/istio-cni", values)
}

// InstallChart is Install of another chart: a packaged one, or one in a registry
// (oci://REGISTRY/charts/istio-cni with --version in values).
func (s *Session) InstallChart(ctx context.Context, chart string, values []string) (time.Duration, *corev1.Pod, error) {
	began := time.Now()
	args := append([]string{"install", Release, chart, "-n", Namespace}, values...)
	if _, err := s.Sh(ctx, s.Tools.Helm, args...); err != nil {
		return 0, nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	pod, err := WaitAgentReady(wctx, s.Node, Namespace)
	if err != nil {
		// Say why: the agent's own last words (a crash-looping agent exits with a
		// message naming the bad setting).
		logs, lerr := s.Kubectl(ctx, "logs", "-n", Namespace, "daemonset/istio-cni-node", "-c", "install-cni", "--previous", "--tail=20")
		if lerr != nil {
			logs, _ = s.Kubectl(ctx, "logs", "-n", Namespace, "daemonset/istio-cni-node", "-c", "install-cni", "--tail=20")
		}
		err = fmt.Errorf("%w; the agent's log ends:\n%s", err, logs)
	}
	return time.Since(began), pod, err
}

// Upgrade runs helm upgrade with values.
func (s *Session) Upgrade(ctx context.Context, values []string) error {
	args := append([]string{"upgrade", Release, "charts/istio-cni", "-n", Namespace}, values...)
	_, err := s.Sh(ctx, s.Tools.Helm, args...)
	return err
}

// Uninstall runs helm uninstall and waits for the agent pods to be gone (the agent
// removes its config entry and binaries on the way out).
func (s *Session) Uninstall(ctx context.Context) error {
	if _, err := s.Sh(ctx, s.Tools.Helm, "uninstall", Release, "-n", Namespace); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return WaitAgentGone(wctx, s.Node, Namespace)
}

// Request makes one HTTP GET from the app container of from to the app of to, by
// pod IP (the node has no kube-proxy, so no Services), and returns the answer.
func (s *Session) Request(ctx context.Context, from, to *corev1.Pod) (string, error) {
	return s.RequestTo(ctx, from, joinHostPort(to.Status.PodIP, "8080"))
}

// RequestTo is Request to an address of the app ("[fd00::5]:8080" for its IPv6 one).
func (s *Session) RequestTo(ctx context.Context, from *corev1.Pod, hostPort string) (string, error) {
	return s.Kubectl(ctx, "exec", "-n", from.Namespace, from.Name, "-c", "app", "--", "proxy-standin", "get", "http://"+hostPort+"/")
}

// exitRequestFailed is proxy-standin get's exit status for a failed request
// (cmd/proxy-standin's ExitRequestFailed); kubectl exec exits with it too.
const exitRequestFailed = 3

// ExecFailed says that err, from Request or RequestTo, is not the request's own
// failure but the exec's: kubectl could not run proxy-standin in the pod (the
// kubelet or the runtime refused or timed out), so nothing was learnt about the
// traffic.
func ExecFailed(err error) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.ExitCode() != exitRequestFailed
}

func joinHostPort(ip, port string) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + port
	}
	return ip + ":" + port
}

// ProxyLog is kubectl logs of the pod's istio-proxy stand-in.
func (s *Session) ProxyLog(ctx context.Context, p *corev1.Pod) (string, error) {
	return s.Kubectl(ctx, "logs", "-n", p.Namespace, p.Name, "-c", "istio-proxy")
}

// ShowRules prints and returns the rules of the pod's network namespace as
// iptables-save prints them, found the way a person on the node finds it.
func (s *Session) ShowRules(ctx context.Context, p *corev1.Pod) (string, error) {
	return s.showRules(ctx, p, "iptables-save")
}

// ShowRules6 is ShowRules for IPv6 (ip6tables-save).
func (s *Session) ShowRules6(ctx context.Context, p *corev1.Pod) (string, error) {
	return s.showRules(ctx, p, "ip6tables-save")
}

func (s *Session) showRules(ctx context.Context, p *corev1.Pod, save string) (string, error) {
	pid, err := PID(ctx, s.Node, p, "app")
	if err != nil {
		return "", err
	}
	fmt.Fprintf(s.Out, "  $ ctr -a %s -n k8s.io tasks ls | grep %s   # the app container's pid: %d\n",
		s.Node.ContainerdSocket(), shortID(p, "app"), pid)
	return s.Sh(ctx, "nsenter", "-t", fmt.Sprint(pid), "-n", save)
}

func shortID(p *corev1.Pod, container string) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			id := strings.TrimPrefix(cs.ContainerID, "containerd://")
			if len(id) > 12 {
				id = id[:12]
			}
			return id
		}
	}
	return "?"
}

// ConfDir is the content of the node's CNI config dir, file name -> bytes.
func ConfDir(n *node.Node) (map[string]string, error) {
	entries, err := os.ReadDir(n.CNIConfDir())
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(n.CNIConfDir(), e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = string(data)
	}
	return out, nil
}

// BinDir lists the node's CNI bin dir.
// AfterUninstall is the bin dir's listing after an uninstall, given the one
// before the install: the same, with the plugin's binary, which the uninstall
// leaves for the DELs of the pods it set up.
func AfterUninstall(before []string) []string {
	out := slices.Clone(before)
	if !slices.Contains(out, "istio-cni") {
		out = append(out, "istio-cni")
	}
	slices.Sort(out)
	return out
}

func BinDir(n *node.Node) ([]string, error) {
	entries, err := os.ReadDir(n.CNIBinDir())
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// SameDir compares two ConfDir snapshots and says how they differ.
func SameDir(before, after map[string]string) error {
	var diffs []string
	for name, b := range before {
		a, ok := after[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" is gone")
		case !bytes.Equal([]byte(a), []byte(b)):
			diffs = append(diffs, fmt.Sprintf("%s changed:\n--- before\n%s\n--- after\n%s", name, b, a))
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			diffs = append(diffs, name+" was added")
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("%s", strings.Join(diffs, "; "))
	}
	return nil
}
