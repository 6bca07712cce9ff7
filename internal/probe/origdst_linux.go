package probe

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h);
// golang.org/x/sys/unix names only the IPv4 option, which has the same value.
const ip6tSoOriginalDst = 80

// OriginalDst returns the destination c's client connected to before NAT (the
// capture's REDIRECT) rewrote it, for IPv4 and IPv6 connections alike. A connection
// conntrack tracks but NAT did not touch reports c's local address. One conntrack
// does not track fails with an error wrapping unix.ENOENT.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", err)
	}
	// An IPv4 connection accepted by a dual-stack socket has a v4-mapped address;
	// conntrack tracks it as IPv4.
	ipv4 := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().Is4()
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if ipv4 {
			var sa unix.RawSockaddrInet4
			serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
			dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), networkPort(sa.Port))
			return
		}
		var sa unix.RawSockaddrInet6
		serr = getsockopt(fd, unix.SOL_IPV6, ip6tSoOriginalDst, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
		dst = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), networkPort(sa.Port))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", err)
	}
	return dst, nil
}

// getsockopt reads a struct option; unix offers no getter for a sockaddr.
func getsockopt(fd uintptr, level, name int, p unsafe.Pointer, size uintptr) error {
	n := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(name), uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// networkPort reads a port the kernel stored in network byte order into a
// native-endian field.
func networkPort(p uint16) uint16 {
	return binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p))[:])
}
