package capture

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// routingFamilies are the families the plan captures, as netlink families.
func routingFamilies(plan *redirect.Plan) []int {
	fams := []int{unix.AF_INET}
	if plan.Family(redirect.IPv6) != nil {
		fams = append(fams, unix.AF_INET6)
	}
	return fams
}

func tproxyRule(fam int, r *redirect.Routing) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = fam
	rule.Mark = r.Mark
	rule.Table = r.Table
	return rule
}

func tproxyRoute(fam int, r *redirect.Routing, lo netlink.Link) *netlink.Route {
	dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if fam == unix.AF_INET6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &netlink.Route{Family: fam, Dst: dst, Type: unix.RTN_LOCAL, Table: r.Table, LinkIndex: lo.Attrs().Index, Scope: unix.RT_SCOPE_HOST}
}

func passthroughAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// applyRouting sets up TPROXY's policy routing (fwmark MARK -> table TABLE, whose
// default route is local via lo) and IPv6's inbound passthrough address ::6 on lo.
// Existing entries are kept, so it is idempotent.
func applyRouting(plan *redirect.Plan) error {
	if plan.Routing == nil && !plan.IPv6InboundPassthroughAddr.IsValid() {
		return nil // the common REDIRECT, IPv4-only pod: no netlink round trip at all
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if p := plan.IPv6InboundPassthroughAddr; p.IsValid() {
		if err := netlink.AddrReplace(lo, passthroughAddr(p)); err != nil {
			return fmt.Errorf("add %s to lo: %w", p, err)
		}
	}
	if plan.Routing == nil {
		return nil
	}
	for _, fam := range routingFamilies(plan) {
		if err := netlink.RouteReplace(tproxyRoute(fam, plan.Routing, lo)); err != nil {
			return fmt.Errorf("add local default route to table %d: %w", plan.Routing.Table, err)
		}
		if ok, err := hasRule(fam, plan.Routing); err != nil {
			return err
		} else if !ok {
			if err := netlink.RuleAdd(tproxyRule(fam, plan.Routing)); err != nil {
				return fmt.Errorf("add rule fwmark %d lookup %d: %w", plan.Routing.Mark, plan.Routing.Table, err)
			}
		}
	}
	return nil
}

func hasRule(fam int, r *redirect.Routing) (bool, error) {
	rules, err := netlink.RuleList(fam)
	if err != nil {
		return false, fmt.Errorf("list rules: %w", err)
	}
	for _, x := range rules {
		if x.Mark == r.Mark && x.Table == r.Table {
			return true, nil
		}
	}
	return false, nil
}

// removeRouting removes what applyRouting adds, and says what it removed; missing
// entries are not errors. It looks before it changes anything, in ways that do not
// take the kernel's routing lock (rtnl) on current kernels: the address in
// /proc/thread-self/net/if_inet6 (never under the lock), the rules and the table's
// routes by netlink dumps (the rule dump is lock-free since Linux 6.9; on 6.18 a
// burst's DELs showed no wait on the lock at all). A pod that never had TPROXY
// routing nor the passthrough address, the common REDIRECT pod, yet the default
// plan every DEL cleans up with, then costs no change and no wait on that lock,
// which a node deleting many pods at once (each one's veth and namespace teardown
// holding it) makes long. On older kernels the dumps take the lock, as the
// deletions they spare did.
//
// tried counts the deletions it tried, each a change under that lock: a test
// checks that a look spares every one it should.
func removeRouting(plan *redirect.Plan) (removed []string, tried int, err error) {
	var errs []error
	var lo netlink.Link
	findLo := func() bool {
		if lo != nil {
			return true
		}
		l, err := netlink.LinkByName("lo")
		if err != nil {
			errs = append(errs, fmt.Errorf("find lo: %w", err))
			return false
		}
		lo = l
		return true
	}
	if p := plan.IPv6InboundPassthroughAddr; p.IsValid() && onLo(ifInet6, p.Addr()) && findLo() {
		tried++
		if err := netlink.AddrDel(lo, passthroughAddr(p)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove %s from lo: %w", p, err))
		} else if err == nil {
			removed = append(removed, fmt.Sprintf("address %s on lo", p))
		}
	}
	if plan.Routing == nil {
		return removed, tried, errors.Join(errs...)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for {
			ok, err := hasRule(fam, plan.Routing)
			if err != nil || !ok {
				break
			}
			tried++
			if err := netlink.RuleDel(tproxyRule(fam, plan.Routing)); err != nil {
				errs = append(errs, fmt.Errorf("remove rule fwmark %d: %w", plan.Routing.Mark, err))
				break
			}
			removed = append(removed, fmt.Sprintf("rule fwmark %d lookup %d (family %d)", plan.Routing.Mark, plan.Routing.Table, fam))
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: plan.Routing.Table}, netlink.RT_FILTER_TABLE)
		switch {
		case errors.Is(err, unix.EAFNOSUPPORT):
			continue // the family is off in this namespace: nothing of it to remove
		case err == nil && !slices.ContainsFunc(routes, isTProxyRoute):
			continue
		}
		// A local route of the table is there, or the list failed: delete as if it were.
		if !findLo() {
			continue
		}
		tried++
		if err := netlink.RouteDel(tproxyRoute(fam, plan.Routing, lo)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove local route from table %d: %w", plan.Routing.Table, err))
		} else if err == nil {
			removed = append(removed, fmt.Sprintf("local default route of table %d (family %d)", plan.Routing.Table, fam))
		}
	}
	return removed, tried, errors.Join(errs...)
}

// isTProxyRoute says whether r, a route of the TPROXY table, is applyRouting's:
// the local default route.
func isTProxyRoute(r netlink.Route) bool {
	return r.Type == unix.RTN_LOCAL && (r.Dst == nil || r.Dst.IP.IsUnspecified())
}

// ifInet6 lists the calling thread's namespace's IPv6 addresses. The kernel
// writes it under RCU, never under rtnl.
const ifInet6 = "/proc/thread-self/net/if_inet6"

// onLo says whether addr is an address of lo in the namespace whose if_inet6 file
// is at path (ifInet6 for the calling thread's): each line is the address in 32
// hex digits, four hex fields and the interface's name. A namespace without IPv6
// has no such file (or an empty one): no. A file that cannot be read otherwise:
// yes, so the caller removes as before.
func onLo(path string, addr netip.Addr) bool {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	want := hex.EncodeToString(addr.AsSlice())
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 6 && f[0] == want && f[5] == "lo" {
			return true
		}
	}
	return false
}

// verifyRouting lists what of applyRouting's work is missing.
func verifyRouting(plan *redirect.Plan) ([]string, error) {
	if plan.Routing == nil && !plan.IPv6InboundPassthroughAddr.IsValid() {
		return nil, nil // the common REDIRECT, IPv4-only pod: nothing to read
	}
	var diffs []string
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	if p := plan.IPv6InboundPassthroughAddr; p.IsValid() {
		addrs, err := netlink.AddrList(lo, unix.AF_INET6)
		if err != nil {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		found := false
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Addr() {
				found = true
			}
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("address %s missing on lo", p))
		}
	}
	if plan.Routing == nil {
		return diffs, nil
	}
	for _, fam := range routingFamilies(plan) {
		ok, err := hasRule(fam, plan.Routing)
		if err != nil {
			return nil, err
		}
		if !ok {
			diffs = append(diffs, fmt.Sprintf("policy rule fwmark %d lookup %d missing (family %d)", plan.Routing.Mark, plan.Routing.Table, fam))
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: plan.Routing.Table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes of table %d: %w", plan.Routing.Table, err)
		}
		found := false
		for _, r := range routes {
			if r.Type == unix.RTN_LOCAL && r.LinkIndex == lo.Attrs().Index {
				found = true
			}
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("local default route via lo missing from table %d (family %d)", plan.Routing.Table, fam))
		}
	}
	return diffs, nil
}
