// Command capture-demo shows the redirect engine on live traffic: it builds a
// throwaway pod namespace and a peer namespace, applies Istio's default sidecar
// capture with each backend, sends real connections and prints where they land,
// then removes everything. It exits non-zero if any connection lands elsewhere
// than Istio's capture would send it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/sandbox"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

func main() {
	sandbox.RunChildIfAsked()
	backendsFlag := flag.String("backends", "iptables-nft,iptables-legacy"+extraBackends, "comma-separated backends to demonstrate")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "capture-demo: run as root: it creates network namespaces and netfilter rules")
		os.Exit(1)
	}
	failed := false
	for _, name := range strings.Split(*backendsFlag, ",") {
		if err := demo(context.Background(), strings.TrimSpace(name)); err != nil {
			fmt.Printf("\nFAILED (%s): %v\n", name, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
	fmt.Println("\nAll connections landed where Istio's capture sends them.")
}

// newBackend is extended by backends that register themselves (nftables).
var newBackend = func(name string) (capture.Backend, error) {
	switch name {
	case "iptables-nft":
		return iptables.NewBackend(iptables.Config{Mode: iptables.ModeNFT})
	case "iptables-legacy":
		return iptables.NewBackend(iptables.Config{Mode: iptables.ModeLegacy})
	}
	return nil, fmt.Errorf("unknown backend %q", name)
}

var extraBackends = ""

type flow struct {
	words string
	from  string
	uid   uint32
	dst   netip.AddrPort
	want  string
}

func demo(ctx context.Context, backendName string) error {
	b, err := newBackend(backendName)
	if err != nil {
		return err
	}
	fmt.Printf("\n==================== backend: %s ====================\n", b.Name())
	tp, err := sandbox.New("/run/netns", "istio-demo-")
	if err != nil {
		return err
	}
	defer tp.Close()
	exe, dir, err := sandbox.ExecutableCopy()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	listeners := []struct {
		ns, name, addr string
	}{
		{tp.Pod, "proxy-outbound(15001)", "0.0.0.0:15001"},
		{tp.Pod, "proxy-inbound(15006)", "0.0.0.0:15006"},
		{tp.Pod, "app(8080)", "0.0.0.0:8080"},
		{tp.Peer, "remote-service(80)", "0.0.0.0:80"},
	}
	for _, l := range listeners {
		c, err := sandbox.Serve(l.ns, 0, l.name, "tcp4", l.addr, false)
		if err != nil {
			return err
		}
		defer c.Close()
	}
	fmt.Printf("Pod namespace istio-demo-pod (%s), peer namespace istio-demo-peer (%s), joined by veth.\n", sandbox.PodV4, sandbox.PeerV4)

	spec, err := specs.Sidecar().Spec()
	if err != nil {
		return err
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		return err
	}
	changed, err := capture.Apply(ctx, tp.Pod, b, plan)
	if err != nil {
		return err
	}
	fmt.Printf("\nApplied Istio's default sidecar capture (changed=%v). The rules, as a user sees them:\n", changed)
	show(backendName)

	flows := []flow{
		{"the app (uid 1000) calls the remote service", "pod", 1000, netip.AddrPortFrom(sandbox.PeerV4, 80), "proxy-outbound(15001) 10.88.0.1:80"},
		{"the proxy (uid 1337) calls the remote service", "pod", 1337, netip.AddrPortFrom(sandbox.PeerV4, 80), "remote-service(80) 10.88.0.1:80"},
		{"a client in the peer namespace calls the app", "peer", 0, netip.AddrPortFrom(sandbox.PodV4, 8080), "proxy-inbound(15006) 10.88.0.2:8080"},
		{"the app calls itself on localhost", "pod", 1000, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 8080), "app(8080) 127.0.0.1:8080"},
	}
	fmt.Println("\nLive traffic (answer = listener that accepted it + original destination it read with SO_ORIGINAL_DST):")
	var bad []string
	for _, f := range flows {
		got, err := send(tp, exe, f)
		if err != nil {
			return err
		}
		mark := "ok "
		if got != f.want {
			mark = "BAD"
			bad = append(bad, fmt.Sprintf("%s: got %q, want %q", f.words, got, f.want))
		}
		fmt.Printf("  [%s] %-48s -> %s\n", mark, f.words, got)
	}

	if changed, err = capture.Apply(ctx, tp.Pod, b, plan); err != nil || changed {
		return fmt.Errorf("second apply: changed=%v err=%v (want no change)", changed, err)
	}
	fmt.Println("\nApplying again changes nothing (idempotent).")
	diffs, err := capture.Verify(ctx, tp.Pod, b, plan)
	if err != nil || len(diffs) > 0 {
		return fmt.Errorf("verify: %v %q", err, diffs)
	}
	fmt.Println("Verify reads the live rules back: they match the plan.")

	if _, err := capture.Cleanup(ctx, tp.Pod, b, plan); err != nil {
		return err
	}
	got, err := send(tp, exe, flows[0])
	if err != nil {
		return err
	}
	fmt.Printf("After cleanup the app reaches the remote service directly: %s\n", got)
	if got != "remote-service(80) 10.88.0.1:80" {
		bad = append(bad, "after cleanup: "+got)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d connection(s) landed in the wrong place:\n  %s", len(bad), strings.Join(bad, "\n  "))
	}
	return nil
}

func send(tp *sandbox.Topology, exe string, f flow) (string, error) {
	if f.from == "peer" {
		return sandbox.ProbeFrom(tp.Peer, "tcp", f.dst), nil
	}
	return sandbox.ProbeAs(tp.Pod, exe, f.uid, "tcp", f.dst)
}

// show prints the live rules with the command a user would type.
func show(backendName string) {
	var cmd []string
	switch {
	case strings.HasPrefix(backendName, "iptables-"):
		cmd = []string{"ip", "netns", "exec", "istio-demo-pod", "iptables-" + strings.TrimPrefix(backendName, "iptables-") + "-save"}
	default:
		cmd = []string{"ip", "netns", "exec", "istio-demo-pod", "nft", "list", "ruleset"}
	}
	fmt.Printf("$ %s\n", strings.Join(cmd, " "))
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		fmt.Printf("(%v)\n", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(l, "#") {
			fmt.Println("    " + l)
		}
	}
}
