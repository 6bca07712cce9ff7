package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// tablesHeld says, per family, whether the calling thread's network namespace holds
// any table of this backend's flavour. A family without tables holds nothing of
// ours, so apply and cleanup skip its iptables-save: a pod's new namespace, which
// is what every ADD meets, costs one process (the restore) instead of three. It
// answers true whenever it cannot tell, so the caller reads with iptables-save as
// before. It runs no process: legacy tables are the kernel's per-namespace list
// (/proc/thread-self/net/ip{,6}_tables_names, filled when a table is first used in
// the namespace); iptables-nft's tables are nftables tables of the ip and ip6
// families, listed in one netlink dump.
func (b *Backend) tablesHeld() map[redirect.Family]bool {
	all := map[redirect.Family]bool{redirect.IPv4: true, redirect.IPv6: true}
	if !b.tools[redirect.IPv4].flavoured || !b.tools[redirect.IPv6].flavoured {
		return all // iptables before 1.8: which tables it writes is not the mode's to say
	}
	if b.mode == ModeLegacy {
		for f, name := range map[redirect.Family]string{redirect.IPv4: "ip_tables_names", redirect.IPv6: "ip6_tables_names"} {
			data, err := os.ReadFile("/proc/thread-self/net/" + name)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				all[f] = false // the family's tables module is not loaded: no tables
			case err == nil:
				all[f] = len(data) > 0
			}
		}
		return all
	}
	v4, v6, err := nftTableFamilies()
	if err != nil {
		return all
	}
	all[redirect.IPv4], all[redirect.IPv6] = v4, v6
	return all
}

// nftTableFamilies says whether the calling thread's network namespace holds any
// nftables table of the ip (IPv4) and ip6 (IPv6) families: one table dump over a
// plain netlink socket. It is on every ADD, and a netlink library's connection
// (its poller registration, its buffer sizing) costs several times the dump itself.
// Tables of other families (inet, bridge) do not count: iptables-nft never writes
// them. Any error is returned, and the caller then assumes tables are there.
func nftTableFamilies() (v4, v6 bool, err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return false, false, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	// The kernel answers a dump at once; the bound only keeps a broken kernel from
	// holding the ADD.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return false, false, err
	}
	const seq = 1
	req := make([]byte, unix.NLMSG_HDRLEN+4) // nlmsghdr, nfgenmsg
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETTABLE)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:12], seq)
	req[unix.NLMSG_HDRLEN] = unix.AF_UNSPEC // nfgenmsg: every family, version 0, res_id 0
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, false, fmt.Errorf("netlink table dump: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, false, fmt.Errorf("netlink table dump: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, false, fmt.Errorf("netlink table dump: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return v4, v6, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
						return false, false, fmt.Errorf("netlink table dump: %w", syscall.Errno(-errno))
					}
				}
				return v4, v6, nil
			}
			if len(m.Data) > 0 {
				switch m.Data[0] { // nfgenmsg.nfgen_family
				case unix.NFPROTO_IPV4:
					v4 = true
				case unix.NFPROTO_IPV6:
					v6 = true
				}
			}
		}
	}
}
