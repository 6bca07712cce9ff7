package doctor

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
)

// TestProbeReportsWhereTrafficLands sends real connections in real pod namespaces:
// a pod captured by the plugin's own path (both probes land on the capture ports
// with their original destination), the same pod shape without rules (nothing is
// redirected), and a captured pod whose proxy already holds the outbound port
// (the doctor cannot listen there, so conntrack says where the connection went).
func TestProbeReportsWhereTrafficLands(t *testing.T) {
	root.Require(t)
	cp := startControlPlane(t)
	e := newNodeEnv(t, cp, "10-k8s.conflist", chainedConflist)

	runCapturedPod(t, cp, e.cfg, injectedPod("captured"), netip.MustParseAddr("10.251.8.1"))
	runPod(t, cp, injectedPod("uncaptured"), netip.MustParseAddr("10.251.8.2"))
	_, withProxyNS := runCapturedPod(t, cp, e.cfg, injectedPod("with-proxy"), netip.MustParseAddr("10.251.8.3"))
	// Pods whose settings do not capture the default target: the probe picks one
	// they capture, or says it cannot tell (never "NOT redirected").
	runCapturedPod(t, cp, e.cfg, injectedPod("include-range", withAnnotation("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/8")),
		netip.MustParseAddr("10.251.8.4"))
	runCapturedPod(t, cp, e.cfg, injectedPod("no-outbound", withAnnotation("traffic.sidecar.istio.io/includeOutboundIPRanges", "")),
		netip.MustParseAddr("10.251.8.5"))
	// A pod with hostUsers: false: its capture's owner match reads the pod's ids,
	// so the probe connects as the node's ids its maps make 1337 and 1000.
	usernsIP := netip.MustParseAddr("10.251.8.6")
	usernsPod := createPod(t, cp, injectedPod("userns"), usernsIP)
	applyCapture(t, e.cfg, usernsPod, newPodSandboxInUserNamespace(t, usernsIP).path)
	proxy, err := sandbox.Serve(withProxyNS.path, 1337, "proxy-outbound", "tcp4", "0.0.0.0:15001", false)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()

	for _, tc := range []struct {
		name, pod string
		args      []string
		code      int
		want      []string
	}{
		{"include-range", "app/include-range", nil, 0, []string{
			"outbound ipv4, uid 1000 gid 1000 -> 10.0.0.1:80: redirected to 15001 (original destination preserved)"}},
		{"include-range-named-target", "app/include-range", []string{"--outbound-target", "198.51.100.1:80"}, 0, []string{
			"outbound ipv4, uid 1000 gid 1000 -> 198.51.100.1:80: cannot tell: the pod's settings do not capture 198.51.100.1:80"}},
		{"no-outbound", "app/no-outbound", nil, 0, []string{
			"inbound ipv4, uid 1337 gid 1337 -> 127.0.0.6:15002: redirected to 15006 (original destination preserved)",
			"cannot tell: the pod's settings capture no outbound destination of this family to probe"}},
		{"captured", "app/captured", nil, 0, []string{
			"inbound ipv4, uid 1337 gid 1337 -> 127.0.0.6:15002: redirected to 15006 (original destination preserved)",
			"outbound ipv4, uid 1000 gid 1000 -> 198.51.100.1:80: redirected to 15001 (original destination preserved)"}},
		{"user-namespace", "app/userns", nil, 0, []string{
			"inbound ipv4, uid 1337 gid 1337 (the node's 101337 and 101337) -> 127.0.0.6:15002: redirected to 15006 (original destination preserved)",
			"outbound ipv4, uid 1000 gid 1000 (the node's 101000 and 101000) -> 198.51.100.1:80: redirected to 15001 (original destination preserved)"}},
		{"uncaptured", "app/uncaptured", nil, 1, []string{
			"inbound ipv4, uid 1337 gid 1337 -> 127.0.0.6:15002: NOT redirected: reached 127.0.0.6:15002 directly",
			"outbound ipv4, uid 1000 gid 1000 -> 198.51.100.1:80: NOT redirected: no answer from 198.51.100.1:80"}},
		{"proxy-holds-port", "app/with-proxy", nil, 0, []string{
			"port 15001 ipv4, outbound capture port: held by another process",
			"outbound ipv4, uid 1000 gid 1000 -> 198.51.100.1:80: redirected to 15001 (conntrack; the proxy's listener accepted it)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := e.run(append([]string{"probe", tc.pod, "--connect-timeout", "1s"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s\nstdout:\n%s", code, tc.code, stderr, stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			checkGolden(t, filepath.Join("testdata", "probe", tc.name+".txt.golden"), stdout)
		})
	}
	// The rules are still exactly as the plugin programmed them: probing changed nothing.
	if stdout, _, code := e.run("inspect", "app/captured"); code != 0 {
		t.Errorf("inspect after probe: exit %d\n%s", code, stdout)
	}
}
