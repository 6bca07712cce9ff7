package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// validationExitCode is what Istio's istio-validation init container exits with
// when the redirection is missing; the repair controller looks for it.
const validationExitCode = 126

// validationTarget is an address nothing answers for (TEST-NET-2): only the
// capture, sending it to the outbound listener, can make a connection to it succeed.
var validationTarget = netip.MustParseAddrPort("198.51.100.1:15002")

// validate does what Istio's istio-validation init container does: listen on the
// outbound capture port, connect (as a non-proxy uid) to an address that leads
// nowhere, and succeed only if the connection arrives at the listener with that
// address as its original destination. Without the capture it exits 126.
func validate(outboundPort int, timeout time.Duration) {
	ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", outboundPort))
	if err != nil {
		fmt.Fprintf(os.Stderr, "validation: listen on :%d: %v\n", outboundPort, err)
		os.Exit(1)
	}
	defer ln.Close()
	got := make(chan netip.AddrPort, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if dst, err := originalDst(c.(*net.TCPConn)); err == nil {
			got <- dst
		}
	}()
	c, err := net.DialTimeout("tcp4", validationTarget.String(), timeout)
	if err == nil {
		c.Close()
		select {
		case dst := <-got:
			if dst == validationTarget {
				fmt.Printf("validation passed: a connection to %s arrived at :%d\n", dst, outboundPort)
				return
			}
			fail(fmt.Sprintf("a connection arrived at :%d for %s, want %s", outboundPort, dst, validationTarget))
		case <-time.After(timeout):
		}
	}
	fail(fmt.Sprintf("a connection to %s did not arrive at :%d: the traffic is not redirected (%v)", validationTarget, outboundPort, err))
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "validation failed:", msg)
	os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	os.Exit(validationExitCode)
}
