// Command demo is `make demo`: a real node (kubelet + containerd), istio-cni
// installed on it with its Helm chart from an image built here without a Docker
// engine, and meshed sample pods whose traffic visibly goes through an istio-proxy
// stand-in. It prints each command a user would run and what it shows, checks
// every claim, and exits non-zero if any does not hold. The node is taken down at
// the end; with KEEP=1 the install and its pods stay up until Ctrl-C first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/istio-cni/istio-cni/test/harness/node"
	"github.com/istio-cni/istio-cni/test/harness/repo"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	imagesOnly := flag.String("images", "", "only build the images as OCI archives into this directory, print their digests and exit")
	ver := flag.String("version", "dev", "with -images: the build version stamped into the agent's binaries and its image label (make image VERSION=)")
	flag.Parse()
	if *imagesOnly != "" {
		if err := buildImages(ctx, *imagesOnly, *ver); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		return
	}
	failed, err := run(ctx)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	case failed > 0:
		fmt.Fprintf(os.Stderr, "demo: FAILED: %d checks did not hold\n", failed)
		os.Exit(1)
	}
	fmt.Println("\ndemo: every check held.")
}

// buildImages writes the agent and demo images as OCI archives (ctr images import
// reads them) into dir, and the agent's SBOM beside its archive.
func buildImages(ctx context.Context, dir, ver string) error {
	root, err := repo.Root()
	if err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	im, err := meshnode.BuildImages(ctx, root, dir, ver)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s\n%s@%s\n", meshnode.AgentRef, im.AgentDigest, meshnode.DemoImage, im.DemoDigest)
	for _, a := range im.Archives() {
		fmt.Println(a)
	}
	fmt.Println(im.AgentSBOM)
	return nil
}

type checker struct{ failed int }

func (c *checker) check(ok bool, what string, detail ...any) {
	if ok {
		fmt.Printf("  ok: %s\n", what)
		return
	}
	c.failed++
	fmt.Printf("  FAIL: %s %s\n", what, fmt.Sprint(detail...))
}

func section(format string, args ...any) {
	fmt.Printf("\n== "+format+"\n", args...)
}

func run(ctx context.Context) (failed int, err error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("needs root (containerd, kubelet, network namespaces): sudo make demo")
	}
	root, err := repo.Root()
	if err != nil {
		return 0, err
	}
	tools, err := meshnode.FindTools(ctx, root)
	if err != nil {
		return 0, err
	}
	work, err := os.MkdirTemp("", "istio-cni-demo-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(work)

	section("1. The container images, built without a Docker engine (hack/image)")
	t := time.Now()
	im, err := meshnode.BuildImages(ctx, root, work, "")
	if err != nil {
		return 0, err
	}
	fmt.Printf("  %s@%s  (an index for linux/amd64 and linux/arm64: install-cni, istio-cni, istio-iptables, istio-cni-doctor, static; iptables and nft from Debian packages; reproducible; SBOM %s)\n", meshnode.AgentRef, im.AgentDigest, filepath.Base(im.AgentSBOM))
	fmt.Printf("  %s@%s  (the istio-proxy stand-in and the sample app)\n", meshnode.DemoImage, im.DemoDigest)
	fmt.Printf("  built in %s\n", time.Since(t).Round(100*time.Millisecond))

	section("2. A real node: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet; ptp is the primary CNI")
	// Nodes share host-wide state: wait for any other node (a test run) to finish.
	unlock, err := node.LockMachine()
	if err != nil {
		return 0, err
	}
	defer unlock()
	// Dual-stack pods: each gets an IPv6 address after its IPv4 one.
	n, err := node.Up(ctx, node.Options{Progress: prefixWriter{"  "}, PodCIDRv6: netip.MustParsePrefix("fd00:10:244::/64")})
	if err != nil {
		return 0, err
	}
	defer func() {
		if derr := n.Down(); derr != nil && err == nil {
			err = derr
		}
	}()
	s := &meshnode.Session{Node: n, Tools: tools, Root: root, Out: os.Stdout}
	c := &checker{}
	fmt.Printf("  export KUBECONFIG=%s PATH=%s:$PATH\n", n.Kubeconfig(), filepath.Dir(tools.Kubectl))
	if err := im.Import(ctx, n); err != nil {
		return 0, err
	}
	s.Sh(ctx, n.Ctr(), "-a", n.ContainerdSocket(), "-n", "k8s.io", "images", "ls", "-q", "name~="+meshnode.Hub)

	section("3. helm install: the DaemonSet's agent puts the plugin into the node's CNI config")
	before, err := meshnode.ConfDir(n)
	if err != nil {
		return 0, err
	}
	binsBefore, _ := meshnode.BinDir(n)
	values, err := meshnode.ChartValues(n, im)
	if err != nil {
		return 0, err
	}
	took, agent, err := s.Install(ctx, values)
	if err != nil {
		return 0, err
	}
	fmt.Printf("  helm install -> agent Ready: %s\n", took.Round(10*time.Millisecond))
	_, err = s.Kubectl(ctx, "-n", meshnode.Namespace, "rollout", "status", "daemonset/istio-cni-node", "--timeout=60s")
	c.check(err == nil, "kubectl rollout status says the DaemonSet is rolled out", err)
	s.Kubectl(ctx, "get", "pods", "-n", meshnode.Namespace, "-l", "k8s-app=istio-cni-node", "-o", "wide")
	conflist := filepath.Join(n.CNIConfDir(), "10-ptp.conflist")
	out, _ := s.Sh(ctx, "cat", conflist)
	c.check(pluginTypes(out) == "ptp,istio-cni", "the primary network's chain is now ptp -> istio-cni", "(got ", pluginTypes(out), ")")
	fmt.Println("  The agent reaches the API server as in a cluster, through the kubernetes Service (kube-proxy serves its ClusterIP on this node):")
	s.Kubectl(ctx, "get", "service", "kubernetes", "-n", "default")
	pluginKC := filepath.Join(n.StateDir(), "istio-cni-run", "istio-cni-kubeconfig")
	kc, _ := s.Sh(ctx, "grep", "server:", pluginKC)
	c.check(strings.Contains(kc, "server: https://10.96.0.1:443"), "the kubeconfig the agent wrote for the plugin names that Service's address", "(got ", strings.TrimSpace(kc), ")")
	bins, _ := meshnode.BinDir(n)
	c.check(contains(bins, "istio-cni"), "the agent copied istio-cni into the node's CNI bin dir", bins)

	section("4. A sample app with the istio-proxy stand-in, as Istio's injector leaves it (annotation sidecar.istio.io/status, init container istio-validation, container istio-proxy, uid 1337)")
	pods, err := meshnode.CreatePods(ctx, n,
		// ISTIO_DUAL_STACK=true in istio-proxy: captured over IPv4 and IPv6.
		meshnode.WithValidation(meshnode.DualStack(withLabel(meshnode.MeshedPod("demo", "app"), "svc", "web"))),
		meshnode.WithValidation(meshnode.DualStack(meshnode.MeshedPod("demo", "client"))),
		// The same pod in a namespace the chart excludes (excludeNamespaces: [istio-system]).
		meshnode.MeshedPod("istio-system", "outsider"))
	if err != nil {
		return 0, err
	}
	app, client, outsider := pods[0], pods[1], pods[2]
	s.Kubectl(ctx, "get", "pods", "-n", "demo", "-o", "wide")
	s.Kubectl(ctx, "get", "pods", "-n", "istio-system", "-o", "wide")
	fmt.Println("  Each meshed pod's istio-validation init container (istio-iptables --run-validation, uid 1337) checked the redirection before the app started:")
	validation, _ := s.Kubectl(ctx, "logs", "-n", "demo", "app", "-c", "istio-validation")
	c.check(strings.Contains(validation, "validation passed"), "the app pod's validation passed (it would exit 126 without the rules)")

	section("5. The rules inside the app pod's network namespace")
	fmt.Println("  What the plugin decides for this pod, from its manifest (no cluster access needed):")
	manifest := filepath.Join(work, "app.yaml")
	if y, err := meshnode.Run(ctx, n, tools.Kubectl, "get", "pod", "-n", "demo", "app", "-o", "yaml"); err == nil {
		os.WriteFile(manifest, []byte(y), 0o644)
	}
	fmt.Println("  $ kubectl get pod -n demo app -o yaml > app.yaml")
	doctor, err := im.AgentBinary("istio-cni-doctor")
	c.check(err == nil, "the build left istio-cni-doctor for this machine beside the image", err)
	explain, _ := s.Sh(ctx, doctor, "explain", "-f", manifest)
	c.check(strings.Contains(explain, "ISTIO_"), "istio-cni-doctor explain shows the rules the plugin programs")
	fmt.Println("  And what is really there, read on the node:")
	rules, err := s.ShowRules(ctx, app)
	c.check(err == nil && meshnode.Captured(rules), "the app pod's netns has ISTIO_INBOUND/ISTIO_OUTPUT/ISTIO_REDIRECT with jumps from PREROUTING and OUTPUT", err)
	rules, err = s.ShowRules(ctx, client)
	c.check(err == nil && meshnode.Captured(rules), "the client pod's netns is captured the same way", err)

	section("6. A request from the client's app to the app pod (by pod IP)")
	answer, err := s.Request(ctx, client, app)
	c.check(err == nil && strings.Contains(answer, "hello from app"), "the app answered", err)
	c.check(strings.Contains(answer, "127.0.0.6"), "the app saw the connection come from 127.0.0.6: its own proxy's inbound passthrough, not the client")
	clientLog, _ := s.ProxyLog(ctx, client)
	c.check(contains(meshnode.Forwarded(clientLog, "outbound"), app.Status.PodIP+":8080"), "it left the client through the client's proxy (outbound "+app.Status.PodIP+":8080, read with SO_ORIGINAL_DST)")
	appLog, _ := s.ProxyLog(ctx, app)
	c.check(contains(meshnode.Forwarded(appLog, "inbound"), app.Status.PodIP+":8080"), "it arrived at the app through the app's proxy (inbound "+app.Status.PodIP+":8080)")

	appV6 := netip.AddrPortFrom(meshnode.PodIPv6(app), 8080).String()
	section("6b. The same over IPv6 (the pods are dual-stack, their istio-proxy has ISTIO_DUAL_STACK=true), to " + appV6)
	rules, err = s.ShowRules6(ctx, app)
	c.check(err == nil && meshnode.Captured(rules), "the app pod's netns has the same chains in ip6tables", err)
	answer, err = s.RequestTo(ctx, client, appV6)
	c.check(err == nil && strings.Contains(answer, "hello from app"), "the app answered on its IPv6 address", err)
	c.check(strings.Contains(answer, "[::6]"), "the app saw the connection come from ::6: its proxy's IPv6 inbound passthrough")
	clientLog, _ = s.ProxyLog(ctx, client)
	c.check(contains(meshnode.Forwarded(clientLog, "outbound"), appV6), "it left the client through the client's proxy (outbound "+appV6+")")
	appLog, _ = s.ProxyLog(ctx, app)
	c.check(contains(meshnode.Forwarded(appLog, "inbound"), appV6), "it arrived at the app through the app's proxy (inbound "+appV6+")")

	section("6c. Through a Service: the client's proxy sees the Service's address, captured before kube-proxy translates it")
	s.Kubectl(ctx, "expose", "pod", "app", "-n", "demo", "--name", "web", "--port", "80", "--target-port", "8080", "--selector", "svc=web")
	svcIP, _ := meshnode.Run(ctx, n, tools.Kubectl, "get", "service", "web", "-n", "demo", "-o", "jsonpath={.spec.clusterIP}")
	vip := net.JoinHostPort(strings.TrimSpace(svcIP), "80")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// kube-proxy programs the Service once its EndpointSlice is there.
		if answer, err = meshnode.Run(ctx, n, tools.Kubectl, "exec", "-n", "demo", "client", "-c", "app", "--", "proxy-standin", "get", "http://"+vip+"/"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	answer, err = s.RequestTo(ctx, client, vip)
	c.check(err == nil && strings.Contains(answer, "hello from app"), "the app answered through the Service web ("+vip+")", err)
	clientLog, _ = s.ProxyLog(ctx, client)
	c.check(contains(meshnode.Forwarded(clientLog, "outbound"), vip), "the client's proxy read the Service's address as the original destination (outbound "+vip+")")
	appLog, _ = s.ProxyLog(ctx, app)
	c.check(strings.Count(strings.Join(meshnode.Forwarded(appLog, "inbound"), ","), app.Status.PodIP+":8080") >= 2, "and it reached the app through the app's proxy at the pod's address (inbound "+app.Status.PodIP+":8080)")

	section("7. A pod in an excluded namespace (istio-system) is left alone")
	rules, err = s.ShowRules(ctx, outsider)
	c.check(err == nil && !meshnode.HasIstioRules(rules), "its netns has no ISTIO_ chain or rule", err)
	answer, err = s.Request(ctx, outsider, app)
	c.check(err == nil && strings.Contains(answer, "hello from app"), "its request reaches the app", err)
	outsiderLog, _ := s.ProxyLog(ctx, outsider)
	c.check(len(meshnode.Forwarded(outsiderLog, "outbound")) == 0, "without going through its own proxy (no outbound line)")
	fmt.Println("  The plugin's decisions, as the agent prints them:")
	agentLog, _ := meshnode.Run(ctx, n, tools.Kubectl, "logs", "-n", meshnode.Namespace, agent.Name)
	fmt.Printf("  $ kubectl logs -n %s %s | grep -E 'demo|istio-system'\n", meshnode.Namespace, agent.Name)
	for _, line := range strings.Split(agentLog, "\n") {
		if strings.Contains(line, "demo") || strings.Contains(line, "istio-system") {
			fmt.Printf("    %s\n", line)
		}
	}

	if os.Getenv("KEEP") == "1" {
		fmt.Printf("\nKEEP=1: the node, the chart and the pods stay up until Ctrl-C; then the demo uninstalls and takes the node down. In another shell:\n"+
			"  export PATH=%s:$PATH KUBECONFIG=%s\n  kubectl get pods -A -o wide\n  kubectl logs -n demo app -c istio-proxy\n"+
			"  kubectl exec -n demo client -c app -- proxy-standin get http://%s:8080/\n",
			filepath.Dir(tools.Kubectl), n.Kubeconfig(), app.Status.PodIP)
		<-ctx.Done()
		// The rest runs to the end whatever the signal: the node must come down.
		ctx = context.Background()
	}

	section("8. helm uninstall: the agent takes the plugin out; the CNI config dir is as before")
	for _, p := range []*corev1.Pod{app, client, outsider} {
		meshnode.Run(ctx, n, tools.Kubectl, "delete", "pod", "-n", p.Namespace, p.Name, "--wait=true")
	}
	if err := s.Uninstall(ctx); err != nil {
		return c.failed, err
	}
	after, err := meshnode.ConfDir(n)
	if err == nil {
		err = meshnode.SameDir(before, after)
	}
	c.check(err == nil, "the conf dir holds exactly what it held before helm install", err)
	binsAfter, _ := meshnode.BinDir(n)
	c.check(strings.Join(binsAfter, ",") == strings.Join(meshnode.AfterUninstall(binsBefore), ","),
		"the bin dir too, but for the plugin's binary, kept for the DELs of the pods it set up", binsAfter)
	return c.failed, nil
}

// pluginTypes lists the types of a conflist's plugins: "ptp,istio-cni".
func pluginTypes(conflist string) string {
	var c struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal([]byte(conflist), &c) != nil {
		return "unreadable"
	}
	var types []string
	for _, p := range c.Plugins {
		types = append(types, p.Type)
	}
	return strings.Join(types, ",")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type prefixWriter struct{ prefix string }

func (w prefixWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		fmt.Println(w.prefix + line)
	}
	return len(p), nil
}

// withLabel adds a label to the pod (a Service's selector).
func withLabel(p *corev1.Pod, key, value string) *corev1.Pod {
	p.Labels[key] = value
	return p
}
