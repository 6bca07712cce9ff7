package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
)

// Ports of the test namespace's rules: a connection to redirectedPort is sent to
// capturePort; one from appUID to appPort is sent to appCapturePort; heldPort is
// sent to a port a listener outside the catcher holds.
const (
	capturePort    = 15006
	redirectedPort = 15002
	directPort     = 15003
	refusedPort    = 15004
	appCapturePort = 15001
	appPort        = 15005
	heldPort       = 15008
	heldBy         = 15007
	appUID         = 1000
)

// testNamespace is a fresh network namespace whose lo carries the family's
// loopback address and whose nat OUTPUT chain redirects as the constants say.
func testNamespace(t *testing.T, f Family) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces, iptables); run it as root, as CI does")
	}
	path, err := netns.New(t.TempDir(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(path) })
	tool := "iptables"
	if f == IPv6 {
		tool = "ip6tables"
	}
	port := func(p uint16) string { return strconv.Itoa(int(p)) }
	rules := [][]string{
		{"-p", "tcp", "--dport", port(redirectedPort), "-j", "REDIRECT", "--to-ports", port(capturePort)},
		{"-p", "tcp", "--dport", port(appPort), "-m", "owner", "--uid-owner", strconv.Itoa(appUID), "-j", "REDIRECT", "--to-ports", port(appCapturePort)},
		{"-p", "tcp", "--dport", port(heldPort), "-j", "REDIRECT", "--to-ports", port(heldBy)},
	}
	err = netns.Do(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return err
		}
		for _, r := range rules {
			// A child inherits the namespace of the locked thread that starts it.
			args := append([]string{"-w", "-t", "nat", "-A", "OUTPUT"}, r...)
			if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s %v: %w\n%s", tool, args, err, out)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up %s: %v", path, err)
	}
	return path
}

// A probe connection reports which listener accepted it and the destination it
// had before REDIRECT, in both families; a direct one, its own destination; a
// refused one, the refusal; one made as another uid, that uid's redirection; and
// one another process accepted, the port conntrack says answered.
func TestSendReportsWhereEachConnectionLandsInBothFamilies(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.Name, func(t *testing.T) {
			ns := testNamespace(t, f)
			c := NewCatcher(ns, f)
			defer c.Close()
			ctx := context.Background()
			for _, port := range []uint16{capturePort, directPort, appCapturePort, appPort} {
				if err := c.Listen(ctx, port); err != nil {
					t.Fatal(err)
				}
			}
			// The proxy's listener: it holds the port, so the catcher cannot listen there.
			var held net.Listener
			if err := netns.Do(ns, func() error {
				var err error
				held, err = net.Listen(f.Network, netip.AddrPortFrom(f.Wildcard, heldBy).String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if err := c.Listen(ctx, heldBy); !errors.Is(err, unix.EADDRINUSE) {
				t.Errorf("Listen on a held port: %v, want an error wrapping EADDRINUSE", err)
			}

			at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(f.Loopback, port) }
			for _, tc := range []struct {
				name     string
				conn     Conn
				landedOn uint16 // 0: none of ours
				answered uint16
				refused  bool
			}{
				{name: "redirected", conn: Conn{Target: at(redirectedPort)}, landedOn: capturePort},
				{name: "from a bound source", conn: Conn{Target: at(redirectedPort), Source: f.Loopback}, landedOn: capturePort},
				{name: "direct", conn: Conn{Target: at(directPort)}, landedOn: directPort},
				{name: "refused", conn: Conn{Target: at(refusedPort)}, refused: true},
				{name: "as the app uid", conn: Conn{Target: at(appPort), As: &Identity{UID: appUID, GID: appUID}}, landedOn: appCapturePort},
				{name: "as this process", conn: Conn{Target: at(appPort)}, landedOn: appPort},
				{name: "held by another process", conn: Conn{Target: at(heldPort), Conntrack: true}, answered: heldBy},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tc.conn.Timeout = time.Second
					if tc.landedOn == 0 {
						tc.conn.Timeout = 300 * time.Millisecond
					}
					out, err := c.Send(ctx, tc.conn)
					if err != nil {
						t.Fatal(err)
					}
					if tc.refused {
						if !errors.Is(out.DialErr, unix.ECONNREFUSED) {
							t.Errorf("dial error %v, want connection refused", out.DialErr)
						}
						return
					}
					if out.DialErr != nil {
						t.Fatal(out.DialErr)
					}
					if tc.conn.Source.IsValid() && out.Local.Addr() != tc.conn.Source {
						t.Errorf("connected from %s, want the bound %s", out.Local, tc.conn.Source)
					}
					if tc.landedOn == 0 {
						if out.Landed != nil {
							t.Errorf("landed on our port %d, want none of ours", out.Landed.Port)
						}
						if out.AnsweredBy != tc.answered {
							t.Errorf("conntrack says port %d answered, want %d", out.AnsweredBy, tc.answered)
						}
						return
					}
					if out.Landed == nil {
						t.Fatalf("none of our listeners accepted it, want port %d", tc.landedOn)
					}
					if out.Landed.Port != tc.landedOn {
						t.Errorf("landed on %d, want %d", out.Landed.Port, tc.landedOn)
					}
					// What the client dialled, whether NAT rewrote it or not.
					if out.Landed.Err != nil || out.Landed.OriginalDst != tc.conn.Target {
						t.Errorf("original destination %s (error %v), want %s", out.Landed.OriginalDst, out.Landed.Err, tc.conn.Target)
					}
				})
			}
		})
	}
}

// A uid the process cannot become is an error, not a probe of its own traffic.
func TestSendAsAnotherUIDWithoutTheCapabilityFails(t *testing.T) {
	f := IPv4
	ns := testNamespace(t, f)
	c := NewCatcher(ns, f)
	defer c.Close()
	err := netns.Do(ns, func() error {
		// Without CAP_SETUID and CAP_SETGID (dropped from this thread only), setfsuid
		// quietly keeps the thread's own.
		var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		drop := uint32(1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
		data[0].Effective &^= drop
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return err
		}
		in := &Catcher{family: f, landed: make(chan Landing, 1)} // in this thread's namespace
		_, err := in.Send(context.Background(), Conn{Target: netip.AddrPortFrom(f.Loopback, directPort), As: &Identity{UID: appUID, GID: appUID}, Timeout: time.Second})
		var cred *CredentialsError
		if !errors.As(err, &cred) || cred.What != "uid" || cred.Want != appUID {
			t.Errorf("Send as uid %d without CAP_SETUID: %v, want a CredentialsError for the uid", appUID, err)
		}
		// netns.Do hands this thread back to the runtime: it must be whole again.
		data[0].Effective |= drop
		return unix.Capset(&hdr, &data[0])
	})
	if err != nil {
		t.Fatal(err)
	}
}
