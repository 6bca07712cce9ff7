package node

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/istio-cni/istio-cni/internal/node"
)

// A node whose process is killed (SIGKILL: no Down) leaves containerd's shims, the
// running containers, their network namespaces, mounts and cgroups behind; Cleanup
// must remove them all and restore the host from the snapshot Up saved.
func TestCleanupAfterTheNodeProcessIsKilledLeavesHostAsItWas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (containerd, kubelet, network namespaces); run it with sudo")
	}
	before := hostView(t)
	cidr := testPodCIDR.String()
	state, err := os.MkdirTemp("/var/lib", "istio-cni-node-killed-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "node")
	if out, err := exec.Command("go", "build", "-o", bin, "../../internal/node/cmd/node").CombinedOutput(); err != nil {
		t.Fatalf("build node command: %v\n%s", err, out)
	}

	cmd := exec.Command(bin, "-state", state, "-pod-cidr", cidr, "-name", "killed-node")
	cmd.Dir = "../.."
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		node.Cleanup(state, testPodCIDR, testWriter{t}) // no-op when the test got that far
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "export KUBECONFIG=") {
		t.Fatalf("node command did not come up: %q %v", line, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", strings.TrimSpace(strings.TrimPrefix(line, "export KUBECONFIG=")))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A pod whose sandbox uses the pause image only: no extra image to import.
	pod, _ := runPodImage(t.Context(), t, cs, "orphan", node.PauseImage)
	if pod == nil {
		t.FailNow()
	}
	ip := checkPodIP(t, pod)

	// Killing the command kills its children (Pdeathsig) but not containerd's shims
	// nor the containers.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	time.Sleep(300 * time.Millisecond)
	if left := node.Leftovers(state, testPodCIDR); len(left) == 0 {
		t.Fatal("a killed node left nothing behind: this test would prove nothing")
	}
	if !hasRoute(t, ip) {
		t.Errorf("route to the orphaned pod %s already gone before Cleanup", ip)
	}

	began := time.Now()
	if err := node.Cleanup(state, testPodCIDR, testWriter{t}); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	t.Logf("cleanup after a killed node: %s", time.Since(began).Round(time.Millisecond))
	if left := node.Leftovers(state, testPodCIDR); len(left) > 0 {
		t.Errorf("left on the host after cleanup:\n%s", strings.Join(left, "\n"))
	}
	after := hostView(t)
	for _, k := range sortedKeys(before) {
		if before[k] != after[k] {
			t.Errorf("host changed: %s was %q, is %q after cleanup", k, before[k], after[k])
		}
	}
	for _, k := range sortedKeys(after) {
		if _, ok := before[k]; !ok {
			t.Errorf("host changed: %s appeared (%q)", k, after[k])
		}
	}
}
