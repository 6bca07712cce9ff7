package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/probe"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// Addresses of the topology.
var (
	PodV4  = netip.MustParseAddr("10.88.0.2")
	PeerV4 = netip.MustParseAddr("10.88.0.1")
	PodV6  = netip.MustParseAddr("fd88::2")
	PeerV6 = netip.MustParseAddr("fd88::1")
	// RoutedV4 and RoutedV6 are addresses the peer routes to the pod, which
	// does not hold them (as a node routes a service's address to an endpoint
	// behind it): only TPROXY's policy routing (fwmark -> a local route)
	// delivers their connections to the pod's proxy, and without it the pod
	// drops them (it forwards nothing).
	RoutedV4 = netip.MustParseAddr("10.66.0.9")
	RoutedV6 = netip.MustParseAddr("fd66::9")
)

// Topology is a pod namespace and a peer namespace joined by veth (eth0 in both). The
// pod's default routes go through the peer; the peer routes RoutedV4 and RoutedV6
// through the pod.
type Topology struct {
	Pod, Peer string
	// podHeld: Pod is held by a process until the test ends
	// (NewUserNamespaced), not mounted.
	podHeld bool
}

// New builds a topology with its namespaces mounted under dir as PREFIXpod and
// PREFIXpeer (with dir /run/netns, `ip netns exec` reaches them).
func New(dir, prefix string) (*Topology, error) {
	tp := &Topology{}
	var err error
	if tp.Pod, err = testns.New(dir, prefix+"pod"); err != nil {
		return nil, err
	}
	return tp.join(dir, prefix)
}

// NewUserNamespaced is New with the pod's network namespace made as the one of a
// pod with hostUsers: false (testns.NewInUserNamespace): owned by a user
// namespace of its own, which maps the pod's uids and gids 0-65535 to the node's
// from testns.UserNamespaceBase on. It lives until the test ends; Close removes
// the peer's.
func NewUserNamespaced(t testing.TB, dir, prefix string) (*Topology, error) {
	tp := &Topology{Pod: testns.NewInUserNamespace(t), podHeld: true}
	return tp.join(dir, prefix)
}

// join makes the peer's namespace and joins it to the pod's.
func (tp *Topology) join(dir, prefix string) (*Topology, error) {
	var err error
	if tp.Peer, err = testns.New(dir, prefix+"peer"); err != nil {
		tp.Close()
		return nil, err
	}
	tmp := fmt.Sprintf("vsb%d", time.Now().UnixNano()%1000000000)
	err = netns.Do(tp.Pod, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: tmp}); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		peerLink, err := netlink.LinkByName(tmp)
		if err != nil {
			return err
		}
		f, err := os.Open(tp.Peer)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := netlink.LinkSetNsFd(peerLink, int(f.Fd())); err != nil {
			return fmt.Errorf("move veth: %w", err)
		}
		return configure("eth0", PodV4, PodV6, PeerV4, PeerV6, true)
	})
	if err == nil {
		err = netns.Do(tp.Peer, func() error {
			l, err := netlink.LinkByName(tmp)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetName(l, "eth0"); err != nil {
				return err
			}
			if err := configure("eth0", PeerV4, PeerV6, PodV4, PodV6, false); err != nil {
				return err
			}
			for _, dst := range []netip.Addr{RoutedV4, RoutedV6} {
				r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(dst.BitLen(), dst.BitLen())}, Gw: PodV4.AsSlice()}
				if dst.Is6() {
					r.Gw = PodV6.AsSlice()
				}
				if err := netlink.RouteAdd(r); err != nil {
					return fmt.Errorf("route %s via the pod: %w", dst, err)
				}
			}
			return nil
		})
	}
	if err != nil {
		tp.Close()
		return nil, fmt.Errorf("build sandbox: %w", err)
	}
	return tp, nil
}

// Close removes both namespaces (and with them the veth pair), or the peer's
// alone when the pod's is held by a process (NewUserNamespaced).
func (tp *Topology) Close() error {
	var first error
	for _, p := range []string{tp.Pod, tp.Peer} {
		if p == "" || p == tp.Pod && tp.podHeld {
			continue
		}
		if err := testns.Delete(p); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func configure(link string, v4, v6, gw4, gw6 netip.Addr, defaultRoute bool) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	for _, a := range []netip.Prefix{netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("add %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	if defaultRoute {
		for _, gw := range []netip.Addr{gw4, gw6} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
	}
	return nil
}

// Serve starts a listener in namespace ns that answers each connection (or datagram)
// with "NAME ORIGDST" (datagrams: "NAME"), where ORIGDST is the destination the
// client dialled: SO_ORIGINAL_DST after REDIRECT, else the local address (TPROXY,
// direct). With uid non-zero the socket belongs to that uid and gid, as netfilter's
// owner match and the DNS conntrack zones see it. transparent sets IP_TRANSPARENT,
// which a TPROXY listener needs.
func Serve(ns string, uid int, name, proto, addr string, transparent bool) (io.Closer, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if transparent && serr == nil {
				if strings.HasSuffix(network, "6") {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				}
			}
		})
		return serr
	}}
	var ln net.Listener
	var pc net.PacketConn
	err := netns.Do(ns, func() error {
		if uid != 0 {
			// fsuid/fsgid are per thread; netns.Do runs fn on a locked thread.
			unix.Setfsgid(uid)
			unix.Setfsuid(uid)
			defer unix.Setfsgid(0)
			defer unix.Setfsuid(0)
		}
		var err error
		if strings.HasPrefix(proto, "udp") {
			pc, err = lc.ListenPacket(context.Background(), proto, addr)
		} else {
			ln, err = lc.Listen(context.Background(), proto, addr)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in %s: %w", proto, addr, ns, err)
	}
	if pc != nil {
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte(name+"\n"), from)
			}
		}()
		return pc, nil
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(3 * time.Second))
				orig := dialled(c.(*net.TCPConn))
				bufio.NewReader(c).ReadString('\n')
				c.Write([]byte(name + " " + orig + "\n"))
			}()
		}
	}()
	return ln, nil
}

// dialled is where the client of c connected to: its original destination after
// REDIRECT, else (a direct or TPROXY connection, which conntrack may not track) the
// address it was accepted on.
func dialled(c *net.TCPConn) string {
	if dst, err := probe.OriginalDst(c); err == nil {
		return dst.String()
	}
	return c.LocalAddr().(*net.TCPAddr).AddrPort().String()
}

// Dial sends "hello" over proto ("tcp" or "udp") to dst and returns the one-line
// answer, or "error: ..." when nothing answers.
func Dial(proto string, dst netip.AddrPort) string {
	c, err := net.DialTimeout(proto, dst.String(), 5*time.Second)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	// Generous: the tests share two cores with builds; a lost datagram is rare.
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return "error: " + err.Error()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

const dialEnv = "SANDBOX_DIAL"

// RunChildIfAsked must be called first in main/TestMain of any binary that uses
// ProbeAs: when the process is a probe child it dials, prints the answer and exits.
func RunChildIfAsked() {
	spec := os.Getenv(dialEnv)
	if spec == "" {
		return
	}
	proto, addr, _ := strings.Cut(spec, "/")
	dst, err := netip.ParseAddrPort(addr)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(0)
	}
	fmt.Println(Dial(proto, dst))
	os.Exit(0)
}

// ProbeAs connects from namespace ns as uid (and gid uid) by running exe (a binary
// that calls RunChildIfAsked) as a child process: Go cannot change credentials per
// goroutine. exe must be executable by uid.
func ProbeAs(ns, exe string, uid uint32, proto string, dst netip.AddrPort, args ...string) (string, error) {
	var out []byte
	err := netns.Do(ns, func() error {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), dialEnv+"="+proto+"/"+dst.String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		return "", fmt.Errorf("probe %s %s as uid %d: %w", proto, dst, uid, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ProbeFrom connects from namespace ns in-process (the credentials do not matter).
func ProbeFrom(ns, proto string, dst netip.AddrPort) string {
	var out string
	if err := netns.Do(ns, func() error { out = Dial(proto, dst); return nil }); err != nil {
		return "error: " + err.Error()
	}
	return out
}

// ExecutableCopy copies the running binary to a fresh world-readable directory, so
// probes running as other users can execute it (go test builds into a root-only
// directory). The caller removes the directory.
func ExecutableCopy() (path, dir string, err error) {
	self, err := os.Executable()
	if err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", "sandbox-exe")
	if err != nil {
		return "", "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", dir, err
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return "", dir, err
	}
	path = filepath.Join(dir, filepath.Base(self))
	return path, dir, os.WriteFile(path, data, 0o755)
}

// LoopbackAddr brings lo up in the current network namespace with ip on it: a
// stand-alone pod namespace (no peer) that still owns its pod address. Call it
// inside netns.Do.
func LoopbackAddr(ip netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	return netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(ip.AsSlice())})
}

// LoopedDefaultRoute gives the current network namespace an IPv4 default route
// through a veth pair with both ends inside it (eth0 and eth0-peer): an outbound
// connection then leaves through an interface as in a real pod (netfilter never
// captures traffic to lo), with no peer namespace to build. Call it inside netns.Do.
func LoopedDefaultRoute() error {
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
	return netlink.RouteAdd(&netlink.Route{LinkIndex: veth.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
}
