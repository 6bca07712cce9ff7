package netns

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Addrs returns the addresses the network namespace at path holds on its interfaces,
// in the kernel's order, without loopback and link-local ones: what the pod in it can
// be reached at and send from.
func Addrs(path string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := Do(path, func() error {
		list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range list {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				continue
			}
			out = append(out, ip)
		}
		return nil
	})
	return out, err
}
