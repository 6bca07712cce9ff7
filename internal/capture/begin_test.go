package capture_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// snapshot is what a namespace holds of a capture, as the tools print it: rules
// of both iptables families in both flavours and nftables, policy routing,
// loopback addresses.
func snapshot(t *testing.T, ns string) string {
	t.Helper()
	// iptables-save's comments carry the time, and the counters may differ.
	noise := regexp.MustCompile(`(?m)^#.*\n|\[\d+:\d+\]`)
	var b strings.Builder
	for _, cmd := range [][]string{{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"iptables-legacy-save"}, {"ip6tables-legacy-save"}, {"nft", "list", "ruleset"}, {"ip", "rule"}, {"ip", "-6", "rule"}, {"ip", "-6", "addr", "show", "dev", "lo"}} {
		b.WriteString("$ " + strings.Join(cmd, " ") + "\n")
		b.WriteString(noise.ReplaceAllString(testns.Run(t, ns, exec.Command(cmd[0], cmd[1:]...)), ""))
	}
	return b.String()
}

func newNS(t *testing.T, name string) string {
	t.Helper()
	ns, err := testns.New(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	return ns
}

// TestPendingAppliesWhatApplyApplies: a namespace entered and read ahead of its
// plan (Begin, the ADD's read while it asks the API server) ends up holding
// exactly what Apply writes, with every backend, for REDIRECT and for TPROXY with
// IPv6 (routing and the passthrough address too); and applying the same plan
// again through a Pending changes nothing.
func TestPendingAppliesWhatApplyApplies(t *testing.T) {
	root.Require(t)
	ctx := context.Background()
	plans := map[string]*redirect.Plan{
		"sidecar":     specs.Sidecar().Plan(t),
		"tproxy-ipv6": specs.Settings{redirect.FieldMode: "TPROXY", redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*", redirect.FieldIPv6: "true"}.Plan(t),
	}
	for name, b := range backends(t) {
		for planName, plan := range plans {
			t.Run(name+"/"+planName, func(t *testing.T) {
				direct, ahead := newNS(t, "direct"), newNS(t, "ahead")
				if _, err := capture.Apply(ctx, direct, b, plan); err != nil {
					t.Fatal(err)
				}
				p := capture.Begin(ctx, ahead, b)
				defer p.Close()
				if entered, _, err := p.Ready(); !entered || err != nil {
					t.Fatalf("Ready() = entered %v, read error %v; want entered, read", entered, err)
				}
				changed, err := p.Apply(ctx, plan)
				if err != nil || !changed {
					t.Fatalf("Pending.Apply = %v, %v; want changed", changed, err)
				}
				want, got := snapshot(t, direct), snapshot(t, ahead)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("the namespace applied ahead differs from Apply's (-Apply +Pending):\n%s", diff)
				}
				if !strings.Contains(got, "ISTIO_") && !strings.Contains(got, "istio") {
					t.Errorf("no capture in the namespace:\n%s", got)
				}
				again := capture.Begin(ctx, ahead, b)
				defer again.Close()
				if changed, err := again.Apply(ctx, plan); err != nil || changed {
					t.Errorf("the same plan again = changed %v, %v; want nothing changed", changed, err)
				}
				if diffs, err := capture.Verify(ctx, ahead, b, plan); err != nil || len(diffs) > 0 {
					t.Errorf("Verify = %v, %v", diffs, err)
				}
			})
		}
	}
}

// TestPendingCloseLeavesTheNamespaceAsItWas: a namespace entered and read for a
// pod that then needs no redirection (Close without Apply, or the ADD's context
// ending first) holds nothing new, and an Apply after the context ended fails
// instead of writing.
func TestPendingCloseLeavesTheNamespaceAsItWas(t *testing.T) {
	root.Require(t)
	plan := specs.Sidecar().Plan(t)
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ns := newNS(t, "ns")
			before := snapshot(t, ns)
			p := capture.Begin(context.Background(), ns, b)
			p.Ready()
			p.Close()
			if diff := cmp.Diff(before, snapshot(t, ns)); diff != "" {
				t.Errorf("after Begin and Close (-before +after):\n%s", diff)
			}

			ctx, cancel := context.WithCancel(context.Background())
			p = capture.Begin(ctx, ns, b)
			defer p.Close()
			p.Ready()
			cancel()
			_, err := p.Apply(context.Background(), plan)
			if err == nil || !strings.Contains(err.Error(), "left before the plan came") {
				t.Errorf("Apply after Begin's context ended = %v, want the namespace left", err)
			}
			if diff := cmp.Diff(before, snapshot(t, ns)); diff != "" {
				t.Errorf("after an Apply that came too late (-before +after):\n%s", diff)
			}
		})
	}
}

// TestPendingOnWhatIsNoNamespace: when the namespace cannot be entered ahead (gone,
// or not a namespace), Pending.Apply fails as Apply does, with its error.
func TestPendingOnWhatIsNoNamespace(t *testing.T) {
	root.Require(t)
	plan := specs.Sidecar().Plan(t)
	dir := t.TempDir()
	for name, b := range backends(t) {
		for _, path := range []string{filepath.Join(dir, "gone"), dir} {
			t.Run(name+"/"+filepath.Base(path), func(t *testing.T) {
				_, want := capture.Apply(context.Background(), path, b, plan)
				p := capture.Begin(context.Background(), path, b)
				defer p.Close()
				if entered, _, _ := p.Ready(); entered {
					t.Fatalf("Ready() says %s was entered", path)
				}
				_, got := p.Apply(context.Background(), plan)
				if want == nil || got == nil || got.Error() != want.Error() {
					t.Errorf("Pending.Apply = %v, want Apply's error %v", got, want)
				}
			})
		}
	}
}
