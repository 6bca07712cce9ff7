package scale

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/childproc"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// binaries are install-cni and what it installs, built once per test binary.
var binaries struct {
	once             sync.Once
	err              error
	dir, agent, srcs string
}

func buildBinaries(t testing.TB) (agent, sourceDir string) {
	t.Helper()
	binaries.once.Do(func() {
		binaries.dir, binaries.err = os.MkdirTemp("", "istio-cni-scale-bin-")
		if binaries.err != nil {
			return
		}
		binaries.agent = filepath.Join(binaries.dir, "install-cni")
		binaries.srcs = filepath.Join(binaries.dir, "image-bin")
		for _, b := range []struct{ out, pkg string }{
			{binaries.agent, "./cmd/install-cni"},
			{filepath.Join(binaries.srcs, "istio-cni"), "./cmd/istio-cni"},
			{filepath.Join(binaries.srcs, "istio-iptables"), "./cmd/istio-iptables"},
		} {
			// As the image ships them: static and stripped (make build).
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", b.out, b.pkg)
			cmd.Dir = "../.."
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				binaries.err = fmt.Errorf("build %s: %w: %s", b.pkg, err, out)
				return
			}
		}
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.agent, binaries.srcs
}

// sim is a running simulation: the control plane, the cluster's objects, and the
// agents of the first nodes.
type sim struct {
	cp     *controlplane.ControlPlane
	size   clusterSize
	token  string
	ca     *controlplane.CA
	cert   tls.Certificate
	launch *childproc.Launcher
	root   string // the agents' directories
	agents []*agent
}

// agent is one install-cni process, as the agent of one node.
type agent struct {
	node   string
	dir    string
	proc   *childproc.Process
	proxy  *countingProxy
	http   string // http://127.0.0.1:PORT: /readyz and /metrics
	socket string // the pod cache's unix socket
}

// newSim starts a control plane and fills it with a cluster of size s.
func newSim(t testing.TB, s clusterSize) *sim {
	t.Helper()
	cp := controlplane.StartForTest(t, controlplane.Options{
		// The default in-flight limits would throttle the load generator, not the agents.
		ExtraAPIServerArgs: []string{"--max-requests-inflight=1000", "--max-mutating-requests-inflight=500"},
	})
	ctx := t.Context()
	began := time.Now()
	if err := populate(ctx, loadClient(t, cp), s, 24); err != nil {
		t.Fatalf("populate the cluster: %v", err)
	}
	t.Logf("cluster of %d pods on %d nodes in %d namespaces created in %s", s.Pods, s.nodes(), s.namespaces(), time.Since(began).Round(time.Second))

	kc, err := cp.ServiceAccountKubeconfig(ctx, agentNamespace, "istio-cni", AgentRules)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cp.AdminClient().CoreV1().ServiceAccounts(agentNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni-plugin"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := kube.LoadKubeconfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, err := newProxyCA()
	if err != nil {
		t.Fatal(err)
	}
	// The agents' directories go after the agents (cleanups run last-in first-out).
	sm := &sim{cp: cp, size: s, token: parsed.Token, ca: ca, cert: cert, launch: childproc.NewLauncher(), root: shortdir.New(t)} // the agents' sockets go in it
	t.Cleanup(func() {
		for _, a := range sm.agents {
			a.stop()
			if t.Failed() {
				t.Logf("last lines of the log of the agent of %s:\n%s", a.node, a.proc.Tail(20))
			}
		}
		sm.launch.Close()
	})
	return sm
}

// startAgents starts the agents of nodes 0..n-1 and waits until each is Ready
// and its pod cache has listed its node's pods.
func (sm *sim) startAgents(t testing.TB, n int) {
	t.Helper()
	raiseInotifyInstances(t, n)
	bin, srcs := buildBinaries(t)
	for i := range n {
		a, err := sm.startAgent(sm.root, bin, srcs, nodeName(i))
		if err != nil {
			t.Fatal(err)
		}
		sm.agents = append(sm.agents, a)
	}
	deadline := time.Now().Add(time.Duration(60+n) * time.Second)
	for i := range sm.agents {
		restarts := 0
		for a := sm.agents[i]; !a.synced(); a = sm.agents[i] {
			if !a.proc.Running() {
				// Its port, free when picked, may have been taken since (by a
				// listener: agentPort picks below the ephemeral range): that
				// agent is started again on another, at most three times.
				if restarts < 3 && strings.Contains(a.proc.Tail(5), "address already in use") {
					restarts++
					a.proxy.close()
					b, err := sm.startAgent(sm.root, bin, srcs, a.node)
					if err != nil {
						t.Fatal(err)
					}
					sm.agents[i] = b
					continue
				}
				t.Fatalf("agent of %s exited: %v", a.node, a.proc.ExitError())
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent of %s not Ready with its pod cache synced in time; last lines of its log:\n%s", a.node, a.proc.Tail(30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (sm *sim) startAgent(root, bin, srcs, node string) (*agent, error) {
	dir := filepath.Join(root, node)
	a := &agent{node: node, dir: dir, socket: filepath.Join(dir, "run", "pods.sock")}
	sa := filepath.Join(dir, "sa")
	for _, d := range []string{filepath.Join(dir, "net.d"), filepath.Join(dir, "bin"), sa} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(sa, "token"), []byte(sm.token), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(sa, "ca.crt"), sm.ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	p, err := startProxy(sm.cp.Host(), sm.cp.CAData(), sm.cert)
	if err != nil {
		return nil, err
	}
	a.proxy = p
	monPort, err := agentPort()
	if err != nil {
		return nil, err
	}
	a.http = "http://127.0.0.1:" + strconv.Itoa(monPort)
	host, port, _ := net.SplitHostPort(p.addr)
	env := append([]string{
		"MOUNTED_CNI_NET_DIR=" + filepath.Join(dir, "net.d"),
		"MOUNTED_CNI_BIN_DIR=" + filepath.Join(dir, "bin"),
		"CNI_BIN_SOURCE_DIR=" + srcs,
		"CNI_AGENT_RUN_DIR=" + filepath.Join(dir, "run"),
		"SERVICE_ACCOUNT_DIR=" + sa,
		"KUBERNETES_SERVICE_HOST=" + host,
		"KUBERNETES_SERVICE_PORT=" + port,
		fmt.Sprintf("MONITORING_PORT=%d", monPort),
		fmt.Sprintf("READINESS_PORT=%d", monPort),
		"NODE_NAME=" + node,
		"POD_NAME=" + daemonSetName + "-" + node,
	}, AgentEnv...)
	a.proc, err = sm.launch.Start("install-cni "+node, bin, nil, env, filepath.Join(dir, "agent.log"))
	if err != nil {
		p.close()
		return nil, err
	}
	return a, nil
}

// agentPorts hands out the agents' monitoring ports below the kernel's ephemeral
// range, so that no outgoing connection (hundreds of watches here) can take one
// between its pick and the agent's bind, as a port picked by the kernel could.
var agentPorts struct {
	sync.Mutex
	next int
}

// agentPort returns the next port below the ephemeral range that binds now.
func agentPort() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	agentPorts.Lock()
	defer agentPorts.Unlock()
	if agentPorts.next == 0 {
		agentPorts.next = max(1024, low-8000)
	}
	for ; agentPorts.next < low; agentPorts.next++ {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", agentPorts.next))
		if err != nil {
			continue // held by something else: the next one
		}
		l.Close()
		agentPorts.next++
		return agentPorts.next - 1, nil
	}
	// Below the range all is taken: fall back to a port the kernel picks.
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// synced: Ready, and the pod cache holds the node's pods.
func (a *agent) synced() bool {
	m, err := a.metrics()
	return err == nil && m["istio_cni_pod_cache_synced"] == 1 && m["istio_cni_install_ready"] == 1
}

// metrics reads the agent's /metrics (series without labels only).
func (a *agent) metrics() (map[string]float64, error) {
	resp, err := http.Get(a.http + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	return out, sc.Err()
}

// stop sends SIGTERM (the agent releases its lease and exits) and closes its proxy.
func (a *agent) stop() {
	_ = a.proc.Stop(10 * time.Second)
	a.proxy.close()
}

// getFromCache asks the agent's pod cache for a pod, as the plugin does, and
// returns the HTTP status.
func (a *agent) getFromCache(ctx context.Context, namespace, name string) (int, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", a.socket)
	}}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/v1/pods/"+namespace+"/"+name, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// procStat is a process's resident memory and CPU time so far.
type procStat struct {
	// RSSKiB is VmRSS; AnonKiB its private part (RssAnon: heap and stacks, not the
	// binary's mapped text).
	RSSKiB, AnonKiB float64
	CPUSecs         float64
}

// readProc reads /proc/PID/status (VmRSS) and the CPU time: the sum of the
// threads' run times in /proc/PID/task/*/schedstat, else /proc/PID/stat's utime +
// stime (clock ticks of 1/100 s, the value on Linux).
func readProc(pid int) (procStat, error) {
	var s procStat
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &s.RSSKiB)
		}
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &s.AnonKiB)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces:
	// state is field 3, utime 14 and stime 15.
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat)[i+1:])
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	s.CPUSecs = (ut + st) / 100
	// Finer: the nanoseconds each thread has run (schedstat), summed; an idle agent
	// runs less than a tick (10 ms) in a minute.
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		var ns float64
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				ns += v
			}
		}
		if ns > 0 {
			s.CPUSecs = ns / 1e9
		}
	}
	return s, nil
}

// loadClient is the load generator's client (admin, no client-side rate limit
// worth the name: the cluster is filled and churned as fast as the API server takes it).
func loadClient(t testing.TB, cp *controlplane.ControlPlane) kubernetes.Interface {
	t.Helper()
	cfg := cp.AdminRESTConfig()
	cfg.QPS, cfg.Burst = 5000, 5000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// inotifyInstances is the kernel's per-user limit of inotify instances. Each agent
// watches its CNI config directory with one, all as root: the default 128 lets
// about 120 agents start on one machine (a real node runs one). For more, the
// limit is raised for the run and put back after it, so the host is left as it was.
const inotifyInstances = "/proc/sys/fs/inotify/max_user_instances"

func raiseInotifyInstances(t testing.TB, agents int) {
	t.Helper()
	raw, err := os.ReadFile(inotifyInstances)
	if err != nil {
		t.Fatalf("read %s: %v", inotifyInstances, err)
	}
	was, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("%s: %q: %v", inotifyInstances, raw, err)
	}
	need := agents + 64 // the machine's own users of inotify
	if was >= need {
		return
	}
	if err := os.WriteFile(inotifyInstances, []byte(strconv.Itoa(need)), 0o644); err != nil {
		t.Fatalf("%d agents need %s of at least %d (it is %d): %v", agents, inotifyInstances, need, was, err)
	}
	t.Logf("%s raised from %d to %d for %d agents; put back after the run", inotifyInstances, was, need, agents)
	t.Cleanup(func() {
		if err := os.WriteFile(inotifyInstances, []byte(strconv.Itoa(was)), 0o644); err != nil {
			t.Errorf("put %s back to %d: %v", inotifyInstances, was, err)
		}
	})
}
