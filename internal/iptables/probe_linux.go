package iptables

import (
	"errors"
	"io/fs"
	"os"

	gnft "github.com/google/nftables"

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
	c, err := gnft.New(gnft.AsLasting())
	if err != nil {
		return all
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return all
	}
	all[redirect.IPv4], all[redirect.IPv6] = false, false
	for _, t := range tables {
		switch t.Family {
		case gnft.TableFamilyIPv4:
			all[redirect.IPv4] = true
		case gnft.TableFamilyIPv6:
			all[redirect.IPv6] = true
		case gnft.TableFamilyINet:
			// iptables-nft never writes inet tables; another program's do not hide ours.
		}
	}
	return all
}
