package doctor

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/istioiptables"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestProbeOfAnIPv6OnlyCapturedPodSaysRedirected: an IPv6-only pod (its address
// and default route IPv6, no IPv4 but lo's) whose capture works. Its IPv4
// outbound probe has no route: that tells nothing about the capture (no
// connection of that family can leave the pod, through the proxy or around
// it), so it is reported, and the probe's verdict comes from the flows that
// could be made, which all land on the capture ports; without the capture, the
// same pod is not redirected.
func TestProbeOfAnIPv6OnlyCapturedPodSaysRedirected(t *testing.T) {
	root.Require(t)
	ns, err := testns.New(t.TempDir(), "pod")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testns.Delete(ns) })
	err = netns.Do(ns, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		for _, name := range []string{"eth0", "eth0-peer"} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:10:244::2"), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(eth0, addr); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Scope: netlink.SCOPE_UNIVERSE,
			Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
	})
	if err != nil {
		t.Fatalf("pod namespace: %v", err)
	}
	spec, err := specs.Sidecar().With(specs.Settings{redirect.FieldIPv6: "true"}).Spec()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capture.Apply(t.Context(), ns, nftables.NewBackend(), plan); err != nil {
		t.Fatal(err)
	}
	res, err := Probe(t.Context(), "app/ipv6-only", ns, ns, spec, ProbeOptions{AppUID: 1000,
		OutboundV4: DefaultOutboundV4, OutboundV6: DefaultOutboundV6, ProbePort: istioiptables.DefaultProbePort, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	text := res.Text()
	for _, want := range []string{
		"inbound ipv6, uid 1337 gid 1337 -> [::6]:15002: redirected to 15006 (original destination preserved)",
		"outbound ipv6, uid 1000 gid 1000 -> [2001:db8::1]:80: redirected to 15001 (original destination preserved)",
		"outbound ipv4, uid 1000 gid 1000 -> 198.51.100.1:80: cannot tell: the pod has no route to 198.51.100.1:80",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the probe lacks %q:\n%s", want, text)
		}
	}
	if !res.Redirected {
		t.Errorf("the probe of a pod whose capture works says it is not redirected:\n%s", text)
	}
	// Without its capture the same pod is NOT redirected: the unroutable family
	// hides nothing.
	if _, err := capture.Cleanup(t.Context(), ns, nftables.NewBackend(), plan); err != nil {
		t.Fatal(err)
	}
	res, err = Probe(t.Context(), "app/ipv6-only", ns, ns, spec, ProbeOptions{AppUID: 1000,
		OutboundV4: DefaultOutboundV4, OutboundV6: DefaultOutboundV6, ProbePort: istioiptables.DefaultProbePort, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Redirected {
		t.Errorf("the probe of the pod without its capture says it is redirected:\n%s", res.Text())
	}
}
