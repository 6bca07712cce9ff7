package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/probe"
)

type proxyConfig struct {
	Outbound, Inbound, Health int
}

// Istio's inbound passthrough source addresses: the capture's ISTIO_OUTPUT chain
// returns lo traffic from them before it would send the proxy's own connection to
// the app back to the proxy.
var (
	passthroughV4 = netip.MustParseAddr("127.0.0.6")
	passthroughV6 = netip.MustParseAddr("::6")
)

func runProxy(ctx context.Context, cfg proxyConfig) error {
	out := log.New(os.Stdout, "", 0)
	var lns []net.Listener
	listen := func(network string, port int, handle func(net.Conn)) error {
		host := "0.0.0.0"
		if network == "tcp6" {
			host = "::"
		}
		ln, err := net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
		return nil
	}
	for _, l := range []struct {
		port      int
		direction string
	}{{cfg.Outbound, "outbound"}, {cfg.Inbound, "inbound"}} {
		direction := l.direction
		handle := func(c net.Conn) { forward(out, direction, c.(*net.TCPConn)) }
		if err := listen("tcp4", l.port, handle); err != nil {
			return fmt.Errorf("%s listener: %w", direction, err)
		}
		// A pod without IPv6 has no [::]: IPv4 alone is fine.
		if err := listen("tcp6", l.port, handle); err != nil {
			fmt.Fprintf(os.Stderr, "proxy-standin: %s listener on [::]:%d: %v (IPv4 only)\n", direction, l.port, err)
		}
	}
	health := &http.Server{Addr: ":" + strconv.Itoa(cfg.Health), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})}
	go health.ListenAndServe()
	out.Printf("proxy ready: outbound :%d, inbound :%d, health :%d, uid %d", cfg.Outbound, cfg.Inbound, cfg.Health, os.Getuid())
	<-ctx.Done()
	for _, ln := range lns {
		ln.Close()
	}
	return health.Close()
}

// forward sends c to its original destination and logs one line for it.
func forward(out *log.Logger, direction string, c *net.TCPConn) {
	defer c.Close()
	dst, err := originalDst(c)
	if err != nil {
		out.Printf("%s from %s: not redirected: %v", direction, c.RemoteAddr(), err)
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	if direction == "inbound" {
		src := passthroughV4
		if dst.Addr().Is6() {
			src = passthroughV6
		}
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	up, err := d.Dial("tcp", dst.String())
	if err != nil {
		out.Printf("%s %s via proxy from %s: %v", direction, dst, c.RemoteAddr(), err)
		return
	}
	defer up.Close()
	out.Printf("%s %s via proxy (from %s)", direction, dst, c.RemoteAddr())
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
}

// originalDst reads where c was going before the capture redirected it. A
// connection that was not NATed has none: that is an error, since forwarding it to
// its local address would loop back here.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	dst, err := probe.OriginalDst(c)
	if errors.Is(err, unix.ENOENT) {
		return netip.AddrPort{}, fmt.Errorf("no original destination (the connection was not redirected)")
	}
	if err != nil {
		return netip.AddrPort{}, err
	}
	if local := c.LocalAddr().(*net.TCPAddr).AddrPort(); dst == local {
		return netip.AddrPort{}, fmt.Errorf("original destination is this listener (%s)", dst)
	}
	return dst, nil
}
