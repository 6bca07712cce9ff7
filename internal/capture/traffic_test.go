package capture_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// The test binary doubles as the client that sends traffic under a chosen uid/gid:
// Go cannot change credentials per goroutine, so each probe runs as a child process.
func TestMain(m *testing.M) {
	if spec := os.Getenv("CAPTURE_TEST_DIAL"); spec != "" {
		out, err := dial(spec)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(0)
		}
		fmt.Println(out)
		os.Exit(0)
	}
	// The go tool builds the test binary in a directory only root may enter; the
	// probes run as other users, so they get a copy they can execute.
	dir, err := os.MkdirTemp("", "capture-test")
	if err == nil {
		os.Chmod(dir, 0o755)
		selfCopy = filepath.Join(dir, "capture.test")
		err = copyFile(os.Args[0], selfCopy)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "copy test binary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var selfCopy string

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// dial sends "hello" to proto/addr and returns the one-line answer.
func dial(spec string) (string, error) {
	proto, addr, _ := strings.Cut(spec, "/")
	c, err := net.DialTimeout(proto, addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Addresses of the test topology: a pod namespace and a peer namespace joined by veth.
var (
	podV4  = netip.MustParseAddr("10.88.0.2")
	peerV4 = netip.MustParseAddr("10.88.0.1")
	podV6  = netip.MustParseAddr("fd88::2")
	peerV6 = netip.MustParseAddr("fd88::1")
)

type topology struct {
	pod, peer string
}

// newTopology builds pod and peer namespaces, veth eth0 in both, IPv4 and IPv6, and
// a default route from the pod through the peer.
func newTopology(t *testing.T) topology {
	t.Helper()
	dir := t.TempDir()
	var tp topology
	var err error
	if tp.pod, err = netns.New(dir, "pod"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(tp.pod) })
	if tp.peer, err = netns.New(dir, "peer"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(tp.peer) })
	name := fmt.Sprintf("vt%d", time.Now().UnixNano()%100000000)
	err = netns.Do(tp.pod, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: name}); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		peerLink, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		f, err := os.Open(tp.peer)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := netlink.LinkSetNsFd(peerLink, int(f.Fd())); err != nil {
			return fmt.Errorf("move veth: %w", err)
		}
		return configure("eth0", podV4, podV6, peerV4, peerV6, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = netns.Do(tp.peer, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(l, "eth0"); err != nil {
			return err
		}
		return configure("eth0", peerV4, peerV6, podV4, podV6, false)
	})
	if err != nil {
		t.Fatal(err)
	}
	return tp
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

// serve starts a listener in a namespace that answers each connection (or datagram)
// with "NAME ORIGDST", where ORIGDST is the destination the client dialled: from
// SO_ORIGINAL_DST after REDIRECT, or the local address itself (TPROXY, direct).
func serve(t *testing.T, ns, name, proto, addr string, transparent bool) {
	t.Helper()
	serveAs(t, ns, 0, name, proto, addr, transparent)
}

// serveAs is serve with the listening socket owned by uid (and gid uid): netfilter's
// owner match and the DNS conntrack zones see the socket's credentials, so the DNS
// agent's socket must belong to the proxy user as in a real pod.
func serveAs(t *testing.T, ns string, uid int, name, proto, addr string, transparent bool) {
	t.Helper()
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
		var err error
		if uid != 0 {
			// fsuid/fsgid are per thread, and netns.Do runs on a locked thread.
			unix.Setfsgid(uid)
			unix.Setfsuid(uid)
			defer unix.Setfsgid(0)
			defer unix.Setfsuid(0)
		}
		if strings.HasPrefix(proto, "udp") {
			pc, err = lc.ListenPacket(context.Background(), proto, addr)
		} else {
			ln, err = lc.Listen(context.Background(), proto, addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", proto, addr, err)
	}
	if pc != nil {
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_ = n
				pc.WriteTo([]byte(name+"\n"), from)
			}
		}()
		return
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(3 * time.Second))
				orig, err := originalDst(c.(*net.TCPConn))
				if err != nil {
					orig = "?" + err.Error()
				}
				bufio.NewReader(c).ReadString('\n')
				c.Write([]byte(name + " " + orig + "\n"))
			}()
		}
	}()
}

// originalDst reads the pre-NAT destination of a connection (SO_ORIGINAL_DST); without
// NAT it is the local address.
func originalDst(c *net.TCPConn) (string, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	local := c.LocalAddr().(*net.TCPAddr)
	var out string
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		if local.IP.To4() != nil {
			mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
			if err != nil {
				out = local.String() // not NATed (TPROXY or direct)
				return
			}
			m := mreq.Multiaddr
			out = fmt.Sprintf("%d.%d.%d.%d:%d", m[4], m[5], m[6], m[7], int(m[2])<<8|int(m[3]))
			return
		}
		mtu, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSoOriginalDst)
		if err != nil {
			out = local.String()
			return
		}
		a := netip.AddrFrom16(mtu.Addr.Addr)
		port := int(mtu.Addr.Port&0xff)<<8 | int(mtu.Addr.Port>>8)
		out = netip.AddrPortFrom(a, uint16(port)).String()
	})
	if cerr != nil {
		return "", cerr
	}
	return out, serr
}

// probe sends one request from the pod namespace as uid/gid and returns the answer.
func probe(t *testing.T, ns string, uid uint32, proto string, dst netip.AddrPort) string {
	t.Helper()
	var out []byte
	err := netns.Do(ns, func() error {
		cmd := exec.Command(selfCopy, "-test.run=^$")
		cmd.Env = append(os.Environ(), "CAPTURE_TEST_DIAL="+proto+"/"+dst.String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		t.Fatalf("probe %s %s as %d: %v", proto, dst, uid, err)
	}
	return strings.TrimSpace(string(out))
}

// probeFrom dials from a namespace in-process (credentials do not matter there).
func probeFrom(t *testing.T, ns, proto string, dst netip.AddrPort) string {
	t.Helper()
	var out string
	netns.Do(ns, func() error {
		var err error
		out, err = dial(proto + "/" + dst.String())
		if err != nil {
			out = "error: " + err.Error()
		}
		return nil
	})
	return out
}

const (
	appUID   = 1000
	proxyUID = 1337
)

type flow struct {
	name  string
	from  string // "app", "proxy" (pod, by uid) or "peer" (inbound)
	proto string // tcp, tcp6, udp, udp6
	dst   netip.AddrPort
	want  string // answer prefix: "outbound ORIG", "inbound ORIG", "dns", "peer", "app ..."
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

var (
	resolver4 = netip.MustParseAddr("10.88.0.1") // the peer plays the cluster DNS
	external4 = netip.MustParseAddr("10.88.0.1")
)

// trafficCases drive every backend with real traffic and check where it lands.
var trafficCases = []struct {
	name  string
	opts  redirect.Options
	flows []flow
}{
	{
		name: "default sidecar",
		opts: redirect.Options{InboundPortsInclude: "*", InboundPortsExclude: "15020,15021,15090", OutboundIPRangesInclude: "*", OutboundPortsExclude: "15020"},
		flows: []flow{
			{"app outbound is captured with its original destination", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
			{"proxy outbound is not captured", "proxy", "tcp", ap(external4, 80), "peer"},
			{"app to localhost is not captured", "app", "tcp", ap(netip.MustParseAddr("127.0.0.1"), 8080), "app"},
			{"excluded outbound port is not captured", "app", "tcp", ap(external4, 15020), "peer15020"},
			{"inbound is captured with its original destination", "peer", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"inbound to the tunnel port is not captured", "peer", "tcp", ap(podV4, 15008), "tunnel"},
			{"inbound to an excluded port is not captured", "peer", "tcp", ap(podV4, 15021), "health"},
			{"proxy calling its own pod IP goes through inbound capture", "proxy", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"app calling its own pod IP is not captured", "app", "tcp", ap(podV4, 8080), "app"},
		},
	},
	{
		name: "exclusions and DNS",
		opts: redirect.Options{InboundPortsInclude: "8080", OutboundIPRangesInclude: "*", OutboundIPRangesExclude: "10.88.0.1/32",
			RedirectDNS: true, DNSServers: []string{"10.99.0.10"}},
		flows: []flow{
			{"excluded CIDR is not captured", "app", "tcp", ap(external4, 80), "peer"},
			{"other destinations are captured", "app", "tcp", ap(netip.MustParseAddr("10.77.0.9"), 443), "outbound 10.77.0.9:443"},
			{"DNS over UDP to the resolver goes to the agent", "app", "udp", ap(netip.MustParseAddr("10.99.0.10"), 53), "dns"},
			{"DNS over TCP to the resolver goes to the agent", "app", "tcp", ap(netip.MustParseAddr("10.99.0.10"), 53), "dnstcp"},
			{"the agent's own DNS query is not captured", "proxy", "udp", ap(resolver4, 53), "peerdns"},
			{"inbound on a listed port is captured", "peer", "tcp", ap(podV4, 8080), "inbound 10.88.0.2:8080"},
			{"inbound on an unlisted port is not captured", "peer", "tcp", ap(podV4, 9090), "app9090"},
		},
	},
	{
		name: "TPROXY inbound",
		opts: redirect.Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "*", OutboundIPRangesInclude: "*"},
		flows: []flow{
			{"inbound is transparently proxied, destination preserved", "peer", "tcp", ap(podV4, 8080), "tproxy 10.88.0.2:8080"},
			{"outbound still uses REDIRECT", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
		},
	},
	{
		name: "IPv6",
		opts: redirect.Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", EnableIPv6: true},
		flows: []flow{
			{"IPv6 outbound is captured", "app", "tcp6", ap(peerV6, 80), "outbound [fd88::1]:80"},
			{"IPv6 proxy outbound is not captured", "proxy", "tcp6", ap(peerV6, 80), "peer"},
			{"IPv6 inbound is captured", "peer", "tcp6", ap(podV6, 8080), "inbound [fd88::2]:8080"},
			{"IPv4 outbound is captured too", "app", "tcp", ap(external4, 80), "outbound 10.88.0.1:80"},
		},
	},
}

// backends returns every backend under test, by name.
func backends(t *testing.T) map[string]capture.Backend {
	t.Helper()
	out := map[string]capture.Backend{}
	for name, mk := range backendFactories {
		b, err := mk(t)
		if err != nil {
			t.Fatalf("backend %s: %v", name, err)
		}
		out[name] = b
	}
	return out
}

var (
	factoriesMu      sync.Mutex
	backendFactories = map[string]func(t *testing.T) (capture.Backend, error){}
)

func registerBackend(name string, mk func(t *testing.T) (capture.Backend, error)) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	backendFactories[name] = mk
}

// TestRealTrafficLandsWhereThePlanSays applies each case with each backend in a real
// namespace pair and sends real connections: they must land on the capture listener
// (with SO_ORIGINAL_DST equal to what the client dialled), or bypass it, exactly as
// Istio's capture does. After cleanup every flow reaches its original destination.
func TestRealTrafficLandsWhereThePlanSays(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for bname, b := range backends(t) {
		for _, tc := range trafficCases {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				tp := newTopology(t)
				tproxy := tc.opts.InboundInterceptionMode == "TPROXY"
				for _, proto := range []string{"tcp4", "tcp6"} {
					any := "0.0.0.0"
					if proto == "tcp6" {
						any = "[::]"
					}
					inbound := "inbound"
					if tproxy {
						inbound = "tproxy"
					}
					serve(t, tp.pod, "outbound", proto, any+":15001", false)
					serve(t, tp.pod, inbound, proto, any+":15006", tproxy)
					serve(t, tp.pod, "tunnel", proto, any+":15008", false)
					serve(t, tp.pod, "health", proto, any+":15021", false)
					serve(t, tp.pod, "app", proto, any+":8080", false)
					serve(t, tp.pod, "app9090", proto, any+":9090", false)
					serve(t, tp.pod, "dnstcp", proto, any+":15053", false)
					serve(t, tp.peer, "peer", proto, any+":80", false)
					serve(t, tp.peer, "peer15020", proto, any+":15020", false)
				}
				// Like the Istio agent, the DNS listener binds localhost: REDIRECT sends local
				// traffic to 127.0.0.1, and the reply must come from there to match conntrack.
				serveAs(t, tp.pod, proxyUID, "dns", "udp4", "127.0.0.1:15053", false)
				serve(t, tp.peer, "peerdns", "udp4", "0.0.0.0:53", false)

				spec, err := tc.opts.Spec()
				if err != nil {
					t.Fatal(err)
				}
				plan, err := redirect.Build(spec)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := capture.Apply(ctx, tp.pod, b, plan); err != nil {
					t.Fatal(err)
				}
				for _, f := range tc.flows {
					got := send(t, tp, f)
					if !strings.HasPrefix(got, f.want) || (strings.Contains(f.want, " ") && got != f.want) {
						t.Errorf("%s: %s %s from %s landed on %q, want %q", f.name, f.proto, f.dst, f.from, got, f.want)
					}
				}
				if err := capture.Cleanup(ctx, tp.pod, b, plan); err != nil {
					t.Fatal(err)
				}
				for _, f := range tc.flows {
					if f.from != "app" || f.dst.Port() != 80 {
						continue
					}
					if got := send(t, tp, f); !strings.HasPrefix(got, "peer ") {
						t.Errorf("after cleanup: %s %s landed on %q, want the peer", f.proto, f.dst, got)
					}
				}
			})
		}
	}
}

func send(t *testing.T, tp topology, f flow) string {
	t.Helper()
	proto := strings.TrimSuffix(f.proto, "6")
	switch f.from {
	case "peer":
		return probeFrom(t, tp.peer, proto, f.dst)
	case "proxy":
		return probe(t, tp.pod, proxyUID, proto, f.dst)
	default:
		return probe(t, tp.pod, appUID, proto, f.dst)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces, netfilter); run it as root, as CI does")
	}
}

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSoOriginalDst = 80
