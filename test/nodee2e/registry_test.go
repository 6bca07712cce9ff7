package nodee2e

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/registry"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// pullBound is how long the kubelet gets to report a pull's outcome.
const pullBound = 60 * time.Second

// TestPushedImageAndChartInstallFromARegistryWithAPullSecret is README.md's "Install
// on your cluster" on the node: a real registry (TLS from its own CA, htpasswd auth)
// gets the image and the chart from `make push`; the node's containerd verifies the
// registry against the CA of its hosts.toml (another CA: the pull fails) and pulls
// only with the pod's imagePullSecret (without: refused); `helm
// install oci://…` installs the pushed chart, whose defaults name the pushed image by
// digest; meshed pods are then captured and their traffic goes through their proxies.
func TestPushedImageAndChartInstallFromARegistryWithAPullSecret(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.Start(ctx, theRoot, registry.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := reg.Stop(); err != nil {
			t.Error(err)
		}
	})
	// `docker login` for the user who pushes and installs.
	dockerConfig, err := reg.DockerConfig(t.TempDir(), reg.User, reg.Password)
	if err != nil {
		t.Fatal(err)
	}
	hub := reg.Host + "/mesh"

	// The documented command; BIN keeps the build's output in the test's directory
	// rather than the checkout's bin/.
	push := exec.CommandContext(ctx, "make", "--no-print-directory", "push", "HUB="+hub, "TAG=1.0.0", "CA_FILE="+reg.CAFile, "BIN="+t.TempDir())
	push.Dir = theRoot
	push.Env = append(os.Environ(), "DOCKER_CONFIG="+dockerConfig)
	began := time.Now()
	out, err := push.CombinedOutput()
	t.Logf("make push HUB=%s TAG=1.0.0 CA_FILE=%s (%s):\n%s", hub, reg.CAFile, time.Since(began).Round(time.Second), out)
	if err != nil {
		t.Fatalf("make push: %v", err)
	}
	m := regexp.MustCompile(`(?m)^image ` + regexp.QuoteMeta(hub+"/install-cni:1.0.0@") + `(sha256:[0-9a-f]{64}) \(pushed\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("make push did not print the pushed image %s/install-cni:1.0.0@sha256:...", hub)
	}
	digest := string(m[1])
	if !regexp.MustCompile(`(?m)^chart ` + regexp.QuoteMeta(hub+"/charts/istio-cni:1.0.0@") + `sha256:[0-9a-f]{64} \(pushed\)`).Match(out) {
		t.Fatalf("make push did not print the pushed chart %s/charts/istio-cni:1.0.0@sha256:...", hub)
	}
	pushedImage := hub + "/install-cni@" + digest
	// make push TAG=1.0.0 builds version 1.0.0: not the image the other tests import
	// (version dev). Were they one image, the kubelet (KubeletEnsureSecretPulledImages)
	// would, after this test's pull with a secret, re-pull it for every later pod
	// without that secret, and the imported name cannot be pulled.
	if digest == theImages.AgentDigest {
		t.Errorf("make push TAG=1.0.0 pushed %s, the digest of the dev build", digest)
	}

	// containerd verifies the registry's certificate against the CA of the node's
	// hosts.toml: another CA there, and the pull fails on TLS. (Without any hosts.toml
	// containerd skips verification for a loopback registry, which is why the test
	// configures a wrong one first.)
	wrongCA, err := controlplane.NewCA("not the registry's CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := theNode.TrustRegistry(reg.Host, wrongCA.CertPEM); err != nil {
		t.Fatal(err)
	}
	if msg := pullFailure(t, "registry-pull", "wrong-ca", pushedImage); !strings.Contains(msg, "certificate signed by unknown authority") {
		t.Errorf("the pull with another CA configured failed with %q; want a TLS failure", msg)
	}
	// With the registry's CA, containerd reaches it and, without a pull secret, is
	// refused: the image cannot be pulled anonymously.
	if err := theNode.TrustRegistry(reg.Host, reg.CAPEM); err != nil {
		t.Fatal(err)
	}
	refused := pullFailure(t, "registry-pull", "no-secret", pushedImage)
	if strings.Contains(refused, "certificate") || !strings.Contains(strings.ToLower(refused), "authoriz") && !strings.Contains(refused, "401") {
		t.Errorf("the pull without a secret failed with %q; want an authorization refusal (not a TLS failure)", refused)
	}

	s := session(t)
	s.Env = []string{"DOCKER_CONFIG=" + dockerConfig} // helm reads registry credentials from the docker config too
	if _, err := s.Kubectl(ctx, "create", "secret", "docker-registry", "regcred", "-n", meshnode.Namespace,
		"--docker-server="+reg.Host, "--docker-username="+reg.User, "--docker-password="+reg.Password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		meshnode.Run(ctx, theNode, theTools.Kubectl, "delete", "secret", "regcred", "-n", meshnode.Namespace)
	})
	nodeValues, err := meshnode.NodeValues(theNode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := meshnode.Run(ctx, theNode, theTools.Helm, "status", meshnode.Release, "-n", meshnode.Namespace); err == nil && strings.Contains(out, "STATUS") {
			s.Uninstall(ctx)
		}
	})
	// No hub, tag or digest: the pushed chart defaults to the image pushed with it.
	vals := append([]string{"--version", "1.0.0", "--ca-file", reg.CAFile, "--set", "imagePullSecrets={regcred}"}, nodeValues...)
	took, agent, err := s.InstallChart(ctx, "oci://"+hub+"/charts/istio-cni", vals)
	if err != nil {
		t.Fatalf("helm install from the registry: %v", err)
	}
	t.Logf("helm install oci://%s/charts/istio-cni -> agent Ready: %s", hub, took.Round(10*time.Millisecond))
	if got := agent.Spec.Containers[0].Image; got != pushedImage {
		t.Errorf("the agent runs %s, want the pushed %s", got, pushedImage)
	}
	if got := agent.Spec.ImagePullSecrets; len(got) != 1 || got[0].Name != "regcred" {
		t.Errorf("the agent's imagePullSecrets are %v, want regcred", got)
	}
	// The agent's pull policy is Always: the kubelet asked containerd, which asked the registry.
	if ev := podEvent(t, meshnode.Namespace, agent.Name, "Pulled", "Successfully pulled image"); !strings.Contains(ev, pushedImage) {
		t.Errorf("the agent's Pulled event says %q, want the pushed image %s", ev, pushedImage)
	}
	if _, err := s.Kubectl(ctx, "-n", meshnode.Namespace, "rollout", "status", "daemonset/istio-cni-node", "--timeout=60s"); err != nil {
		t.Error(err)
	}
	if log, err := s.Kubectl(ctx, "-n", meshnode.Namespace, "logs", agent.Name); err != nil || !regexp.MustCompile(`install-cni started.* version=1\.0\.0 `).MatchString(log) {
		t.Errorf("the agent's log does not say version=1.0.0 at start (err %v):\n%s", err, log)
	}

	pods := createPods(t, meshnode.WithValidation(meshnode.MeshedPod("registry-demo", "app")), meshnode.WithValidation(meshnode.MeshedPod("registry-demo", "client")))
	app, client := pods[0], pods[1]
	for _, p := range pods {
		rules, err := s.ShowRules(ctx, p)
		if err != nil || !meshnode.Captured(rules) {
			t.Errorf("pod %s/%s is not captured (err %v):\n%s", p.Namespace, p.Name, err, rules)
		}
	}
	answer, err := s.Request(ctx, client, app)
	if err != nil || !strings.Contains(answer, "hello from app") {
		t.Fatalf("request from client to app: %v: %s", err, answer)
	}
	clientLog, _ := s.ProxyLog(ctx, client)
	if !contains(meshnode.Forwarded(clientLog, "outbound"), app.Status.PodIP+":8080") {
		t.Errorf("the request did not leave the client through its proxy; proxy log:\n%s", clientLog)
	}
	appLog, _ := s.ProxyLog(ctx, app)
	if !contains(meshnode.Forwarded(appLog, "inbound"), app.Status.PodIP+":8080") {
		t.Errorf("the request did not reach the app through its proxy; proxy log:\n%s", appLog)
	}
}

// pullFailure runs the pod name of image (pull policy Always, no pull secret) in
// namespace and returns the kubelet's pull failure for it, within pullBound.
func pullFailure(t *testing.T, namespace, name, image string) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers:                    []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullAlways}},
		},
	}
	if err := meshnode.EnsureNamespace(ctx, theNode, namespace); err != nil {
		t.Fatal(err)
	}
	if _, err := theNode.Client().CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		theNode.Client().CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		waitPodsGone(t, []*corev1.Pod{pod})
	}()
	return podEvent(t, namespace, pod.Name, "Failed", "Failed to pull image")
}

// podEvent waits (at most pullBound) for an event of the pod with reason whose
// message starts with prefix, and returns its message.
func podEvent(t *testing.T, namespace, pod, reason, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(pullBound)
	for time.Now().Before(deadline) {
		evs, err := theNode.Client().CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
		if err == nil {
			for _, e := range evs.Items {
				if strings.HasPrefix(e.Message, prefix) {
					t.Logf("pod %s/%s: %s: %s", namespace, pod, reason, e.Message)
					return e.Message
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("pod %s/%s: no %s event %q... within %s", namespace, pod, reason, prefix, pullBound)
	return ""
}
