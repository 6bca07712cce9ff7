package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

const childEnv = "PROXY_STANDIN_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "proxy" {
		// The proxy itself, started by the test as uid 1337 in the pod namespace.
		if err := run(context.Background(), []string{"proxy", "sidecar"}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "proxy-standin: the proxy test needs root (network namespaces, netfilter)")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// In a pod namespace captured by the project's own rules (Istio's defaults, IPv6
// on), the stand-in, running as uid 1337, receives the app's outbound connections
// and a peer's inbound ones over IPv4 and IPv6, logs each with its original
// destination, and delivers it there: outbound to the peer's server, inbound to
// the app from the passthrough address (127.0.0.6 or ::6).
func TestProxyForwardsRedirectedConnectionsToTheirOriginalDestination(t *testing.T) {
	ctx := context.Background()
	tp, err := sandbox.New(t.TempDir(), fmt.Sprintf("standin%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	dir := t.TempDir()
	b, err := iptables.NewBackend(iptables.Config{Mode: iptables.ModeNFT, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	plan := specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"}).Plan(t)
	if _, err := capture.Apply(ctx, tp.Pod, b, plan); err != nil {
		t.Fatal(err)
	}

	// Servers that answer with who they are and who called: the app in the pod, a
	// remote service in the peer.
	for _, s := range []struct{ ns, name, network, addr string }{
		{tp.Pod, "app", "tcp4", "0.0.0.0:8080"}, {tp.Pod, "app", "tcp6", "[::]:8080"},
		{tp.Peer, "remote", "tcp4", "0.0.0.0:80"}, {tp.Peer, "remote", "tcp6", "[::]:80"},
	} {
		closer := serveWho(t, s.ns, s.name, s.network, s.addr)
		defer closer()
	}

	exe, dir, err := sandbox.ExecutableCopy()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	logs := startProxy(t, tp.Pod, exe)

	cases := []struct {
		name, from string
		dst        netip.AddrPort
		// what the server answers, and the proxy's log line
		answer, log string
	}{
		{"app calls a remote service over IPv4", tp.Pod, netip.AddrPortFrom(sandbox.PeerV4, 80),
			"remote saw " + sandbox.PodV4.String(), "outbound 10.88.0.1:80 via proxy"},
		{"app calls a remote service over IPv6", tp.Pod, netip.AddrPortFrom(sandbox.PeerV6, 80),
			"remote saw " + sandbox.PodV6.String(), "outbound [fd88::1]:80 via proxy"},
		{"a peer calls the app over IPv4", tp.Peer, netip.AddrPortFrom(sandbox.PodV4, 8080),
			"app saw 127.0.0.6", "inbound 10.88.0.2:8080 via proxy"},
		{"a peer calls the app over IPv6", tp.Peer, netip.AddrPortFrom(sandbox.PodV6, 8080),
			"app saw ::6", "inbound [fd88::2]:8080 via proxy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got string
			err := netns.Do(c.from, func() error {
				var err error
				got, err = ask(c.dst)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.answer {
				t.Errorf("answer %q, want %q", got, c.answer)
			}
			select {
			case line := <-logs:
				if !strings.HasPrefix(line, c.log) {
					t.Errorf("proxy logged %q, want %q...", line, c.log)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("the proxy logged nothing, want %q", c.log)
			}
		})
	}
}

// startProxy runs this test binary as the proxy (uid and gid 1337) in namespace ns
// and returns its log lines after the first (ready) one.
func startProxy(t *testing.T, ns, exe string) <-chan string {
	t.Helper()
	var cmd *exec.Cmd
	var stdout io.ReadCloser
	err := netns.Do(ns, func() error {
		cmd = exec.Command(exe)
		cmd.Env = append(os.Environ(), childEnv+"=proxy")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1337, Gid: 1337}, Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		var err error
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return err
		}
		return cmd.Start()
	})
	if err != nil {
		t.Fatalf("start the proxy: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	lines := make(chan string, 16)
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "proxy ready") {
		t.Fatalf("the proxy did not start: %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

// serveWho answers each connection with "NAME saw CALLER-IP" in namespace ns.
func serveWho(t *testing.T, ns, name, network, addr string) func() {
	t.Helper()
	var ln net.Listener
	err := netns.Do(ns, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			caller := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			fmt.Fprintf(c, "%s saw %s\n", name, caller)
			c.Close()
		}
	}()
	return func() { ln.Close() }
}

func ask(dst netip.AddrPort) (string, error) {
	c, err := net.DialTimeout("tcp", dst.String(), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read from %s: %w", dst, err)
	}
	return strings.TrimSpace(line), nil
}
