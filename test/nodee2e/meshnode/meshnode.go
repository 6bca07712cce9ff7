package meshnode

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/istio-cni/istio-cni/hack/image"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/node"
)

// Image names. The hub is a name no registry answers for: pods run what was imported.
const (
	Hub       = "istio-cni.local"
	Tag       = "dev"
	DemoImage = Hub + "/proxy-standin:" + Tag
	AgentRef  = Hub + "/install-cni:" + Tag
)

// Images are the built images, as archives ready for Import.
type Images struct {
	// AgentDigest is the agent's image index (linux/amd64 and linux/arm64): what a
	// registry resolves the agent's name to and what the chart's pods run.
	AgentDigest string // sha256:...
	DemoDigest  string
	// AgentSBOM is the agent image's SPDX document, beside its archive.
	AgentSBOM string
	archives  map[string]string // ref -> archive
	agent     *image.Agent
	dir       string
}

// BuildImages builds the agent image index (install-cni, istio-cni,
// istio-iptables, istio-cni-doctor and the Debian packages of hack/image, for
// linux/amd64 and linux/arm64) with its SBOM, and the demo image (proxy-standin,
// for this machine's architecture) into dir. ver is the agent's build version
// (make image VERSION=; empty: "dev").
func BuildImages(ctx context.Context, root, dir, ver string) (*Images, error) {
	agent, err := image.BuildAgent(ctx, root, filepath.Join(dir, "bin"), AgentRef, ver)
	if err != nil {
		return nil, err
	}
	im := &Images{archives: map[string]string{}, agent: agent, dir: dir}
	agentArchive, sbom, err := agent.Write(dir)
	if err != nil {
		return nil, err
	}
	d, err := agent.Index.Digest()
	if err != nil {
		return nil, err
	}
	im.AgentDigest, im.AgentSBOM, im.archives[AgentRef] = d.String(), sbom, agentArchive

	bins, err := image.GoBuild(ctx, root, filepath.Join(dir, "bin", "demo"), runtime.GOARCH, "", "./test/harness/cmd/proxy-standin", "./cmd/istio-iptables")
	if err != nil {
		return nil, err
	}
	demoSpec := image.Spec{
		Ref:  DemoImage,
		Arch: runtime.GOARCH,
		Files: []image.File{
			{Path: "/usr/local/bin/proxy-standin", Source: bins["proxy-standin"]},
			// The validation init container's program, as in Istio's proxy image.
			{Path: "/usr/local/bin/istio-iptables", Source: bins["istio-iptables"]},
		},
		Entrypoint: []string{"proxy-standin"},
	}
	img, err := image.Build(demoSpec)
	if err != nil {
		return nil, err
	}
	if d, err = img.Digest(); err != nil {
		return nil, err
	}
	im.DemoDigest = d.String()
	archive := filepath.Join(dir, filepath.Base(strings.ReplaceAll(DemoImage, ":", "_"))+".oci.tar")
	if err := image.WriteArchive(archive, DemoImage, img); err != nil {
		return nil, err
	}
	im.archives[DemoImage] = archive
	return im, nil
}

// RebuildAgent builds the agent image again as Hub/install-cni:tag, the same
// binaries with a build label of its own (ISTIO_CNI_BUILD=tag in the image's
// environment), so that it has another digest as a rebuilt release has, imports it
// into the node's containerd and returns its digest: what a helm upgrade to a new
// image needs.
func (im *Images) RebuildAgent(ctx context.Context, n *node.Node, tag string) (string, error) {
	ref := Hub + "/install-cni:" + tag
	agent, err := im.agent.WithRef(ref).WithEnv("ISTIO_CNI_BUILD=" + tag)
	if err != nil {
		return "", err
	}
	d, err := agent.Index.Digest()
	if err != nil {
		return "", err
	}
	archive := filepath.Join(im.dir, "install-cni_"+tag+".oci.tar")
	if err := image.WriteArchive(archive, ref, agent.Index); err != nil {
		return "", err
	}
	defer os.Remove(archive)
	if err := image.Import(ctx, n.Ctr(), n.ContainerdSocket(), archive, ref); err != nil {
		return "", err
	}
	return d.String(), nil
}

// AgentBinary is the path of the agent image's binary name (istio-cni-doctor, say)
// built for this machine's architecture, as the build left it beside the image.
func (im *Images) AgentBinary(name string) (string, error) {
	for _, s := range im.agent.Specs {
		if s.Arch != runtime.GOARCH {
			continue
		}
		for _, f := range s.Files {
			if f.Source != "" && path.Base(f.Path) == name {
				return f.Source, nil
			}
		}
	}
	return "", fmt.Errorf("the agent image for %s has no %s", runtime.GOARCH, name)
}

// Archives are the OCI archives' paths, sorted.
func (im *Images) Archives() []string {
	var out []string
	for _, a := range im.archives {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Import loads both images into the node's containerd.
func (im *Images) Import(ctx context.Context, n *node.Node) error {
	for ref, a := range im.archives {
		if err := image.Import(ctx, n.Ctr(), n.ContainerdSocket(), a, ref); err != nil {
			return err
		}
	}
	return nil
}

// Tools are the command-line programs a user runs against the node.
type Tools struct {
	Helm, Kubectl string
}

// FindTools builds (first run only) and returns the pinned helm and upstream kubectl.
func FindTools(ctx context.Context, root string) (Tools, error) {
	install := exec.CommandContext(ctx, filepath.Join(root, "hack/tools/install.sh"))
	install.Stderr = os.Stderr // the first run builds helm: show its progress
	out, err := install.Output()
	if err != nil {
		return Tools{}, fmt.Errorf("hack/tools/install.sh: %w", err)
	}
	helm := filepath.Join(strings.TrimSpace(string(out)), "helm")
	script := `root=$1; . "$root/hack/node/common.sh"; build_kubectl; echo "$kubectl_dir/kubectl"`
	cmd := exec.CommandContext(ctx, "bash", "-c", script, "bash", root)
	cmd.Stderr = os.Stderr
	out, err = cmd.Output()
	if err != nil {
		return Tools{}, fmt.Errorf("build kubectl: %w", err)
	}
	return Tools{Helm: helm, Kubectl: strings.TrimSpace(string(out))}, nil
}

// APIServer is the host and port of the node's API server as the node itself
// reaches it (the admin kubeconfig's server).
func APIServer(n *node.Node) (host string, port int, err error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig())
	if err != nil {
		return "", 0, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return "", 0, err
	}
	host, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	return host, port, err
}

// ChartValues are the --set arguments that install the chart on n from the
// imported image, pinned by digest. Nothing points the agent at the API server:
// as in a cluster, it uses the kubernetes Service (KUBERNETES_SERVICE_HOST, which
// the node's kube-proxy serves), and so does the kubeconfig it writes for the
// plugin.
func ChartValues(n *node.Node, im *Images) ([]string, error) {
	v, err := NodeValues(n)
	if err != nil {
		return nil, err
	}
	return append([]string{
		"--set", "hub=" + Hub,
		"--set", "tag=" + Tag,
		"--set", "digest=" + im.AgentDigest,
		"--set", "pullPolicy=IfNotPresent",
	}, v...), nil
}

// NodeValues are the --set arguments that fit the chart to n, whatever the image:
// the node's CNI directories, its own agent run and netns dirs, free ports.
func NodeValues(n *node.Node) ([]string, error) {
	// Free ports (the agent uses the host network, and other nodes or tests on this
	// machine may hold the chart's defaults), chosen together: two ports chosen one
	// after the other can be the same one, which the chart refuses on two addresses.
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return nil, err
	}
	metrics, probes := ports[0], ports[1]
	return []string{
		"--set", "cniBinDir=" + n.CNIBinDir(),
		"--set", "cniConfDir=" + n.CNIConfDir(),
		// Per node, not the host's /var/run/istio-cni: other nodes may share this machine.
		"--set", "cniAgentRunDir=" + AgentRunDir(n),
		// Per node too: the kubelet would create the host's /var/run/netns for the
		// hostPath (DirectoryOrCreate).
		"--set", "cniNetnsDir=" + NetnsDir(n),
		"--set", "logLevel=info",
		"--set", "monitoringPort=" + strconv.Itoa(metrics),
		"--set", "probes.port=" + strconv.Itoa(probes),
	}, nil
}

// AgentRunDir is the chart's cniAgentRunDir on n: the node's stand-in for
// /var/run/istio-cni, which is on tmpfs on a real node (node.Reboot empties it).
func AgentRunDir(n *node.Node) string { return filepath.Join(n.StateDir(), "istio-cni-run") }

// NetnsDir is the chart's cniNetnsDir on n, the stand-in for /var/run/netns (tmpfs
// on a real node too).
func NetnsDir(n *node.Node) string { return filepath.Join(n.StateDir(), "netns") }

// Run runs a command with KUBECONFIG set to the node's and returns its combined output.
func Run(ctx context.Context, n *node.Node, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), n.ToolEnv()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// WaitAgentReady waits until the DaemonSet's pod on the node is Ready and returns it.
func WaitAgentReady(ctx context.Context, n *node.Node, namespace string) (*corev1.Pod, error) {
	var last string
	for {
		pods, err := n.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=istio-cni-node"})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp == nil && podReady(p) {
					return p, nil
				}
				last = describe(p)
			}
			if len(pods.Items) == 0 {
				last = "no istio-cni-node pod yet"
			}
		} else if ctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the istio-cni-node pod to be Ready: %w (last: %s)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitAgentGone waits until no agent pod is left in namespace.
func WaitAgentGone(ctx context.Context, n *node.Node, namespace string) error {
	for {
		pods, err := n.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=istio-cni-node"})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the istio-cni-node pods to go: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func describe(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s %s", p.Namespace, p.Name, p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, "; %s=%s %s", c.Type, c.Status, c.Message)
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			fmt.Fprintf(&b, "; %s terminated: %s (exit %d) %s", cs.Name, t.Reason, t.ExitCode, t.Message)
		}
	}
	return b.String()
}
