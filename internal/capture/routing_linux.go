package capture

import (
	"encoding/binary"
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
	"github.com/vishvananda/netlink/nl"
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

// routingEntries is a set of the entries of the capture's routing (one bit each):
// what an applyRouting added, what a removeRouting may remove.
type routingEntries uint8

const (
	// passthroughEntry is IPv6's inbound passthrough address on lo.
	passthroughEntry routingEntries = 1 << iota
	// rule4Entry and rule6Entry are the policy rule fwmark MARK lookup TABLE of
	// IPv4 and IPv6.
	rule4Entry
	rule6Entry
	// route4Entry and route6Entry are table TABLE's local default route via lo
	// of IPv4 and IPv6.
	route4Entry
	route6Entry

	// allRouting is every entry: what the plugin's DEL removes, since it does
	// not know which applies added what.
	allRouting = passthroughEntry | rule4Entry | rule6Entry | route4Entry | route6Entry
)

// ruleEntry and routeEntry are the family fam's rule and route.
func ruleEntry(fam int) routingEntries {
	if fam == unix.AF_INET6 {
		return rule6Entry
	}
	return rule4Entry
}

func routeEntry(fam int) routingEntries {
	if fam == unix.AF_INET6 {
		return route6Entry
	}
	return route4Entry
}

// applyRouting sets up TPROXY's policy routing (fwmark MARK -> table TABLE, whose
// default route is local via lo) and IPv6's inbound passthrough address ::6 on lo,
// and says which of those entries it added. It looks for each entry first and
// keeps one that is there, without counting it (an earlier apply's, or a
// concurrent one's): a failed apply removes what it added and nothing else (see
// Apply). So it is idempotent. With an error, added names what it added before.
//
// Two applies looking at once may both find an entry missing and both add it:
// the address and the route once (a replace), the rule twice (at two
// priorities); each counts it as added. Only a failure of the routing step
// itself, after that, could then remove an entry the other relies on.
func applyRouting(plan *redirect.Plan) (added routingEntries, err error) {
	if plan.Routing == nil && !plan.IPv6InboundPassthroughAddr.IsValid() {
		return 0, nil // the common REDIRECT, IPv4-only pod: no netlink round trip at all
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return 0, fmt.Errorf("find lo: %w", err)
	}
	if r := plan.Routing; r != nil {
		for _, fam := range routingFamilies(plan) {
			if ok, err := hasTProxyRoute(fam, r, lo); err != nil {
				return added, err
			} else if !ok {
				if err := netlink.RouteReplace(tproxyRoute(fam, r, lo)); err != nil {
					return added, fmt.Errorf("add local default route to table %d (family %d): %w", r.Table, fam, err)
				}
				added |= routeEntry(fam)
			}
			if ok, err := hasRule(fam, r); err != nil {
				return added, err
			} else if !ok {
				if err := netlink.RuleAdd(tproxyRule(fam, r)); err != nil {
					return added, fmt.Errorf("add rule fwmark %d lookup %d (family %d): %w", r.Mark, r.Table, fam, err)
				}
				added |= ruleEntry(fam)
			}
		}
	}
	if p := plan.IPv6InboundPassthroughAddr; p.IsValid() {
		if on, err := passthroughOnLo(lo, p); err != nil {
			return added, err
		} else if !on {
			if err := netlink.AddrReplace(lo, passthroughAddr(p)); err != nil {
				return added, fmt.Errorf("add %s to lo: %w", p, err)
			}
			added |= passthroughEntry
		}
	}
	return added, nil
}

// passthroughOnLo says whether lo holds the passthrough address p: what
// applyRouting keeps and verifyRouting finds.
func passthroughOnLo(lo netlink.Link, p netip.Prefix) (bool, error) {
	addrs, err := netlink.AddrList(lo, unix.AF_INET6)
	if err != nil {
		return false, fmt.Errorf("list addresses: %w", err)
	}
	return slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
		ip, ok := netip.AddrFromSlice(a.IP)
		return ok && ip.Unmap() == p.Addr()
	}), nil
}

// hasTProxyRoute says whether family fam's table r.Table holds the local default
// route via lo that applyRouting adds: what applyRouting keeps and verifyRouting
// finds.
func hasTProxyRoute(fam int, r *redirect.Routing, lo netlink.Link) (bool, error) {
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: r.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, fmt.Errorf("list routes of table %d: %w", r.Table, err)
	}
	return slices.ContainsFunc(routes, func(rt netlink.Route) bool {
		return isTProxyRoute(rt) && rt.LinkIndex == lo.Attrs().Index
	}), nil
}

// policyRule is one rule of a namespace's policy routing database as the kernel
// dumps it, in the kernel's order: what decides whether a rule is ours, and
// which rule a deletion would remove.
type policyRule struct {
	priority uint32
	// ours: the rule is exactly the one applyRouting adds (isOurRule).
	ours bool
	// deletable: a deletion of our rule at priority would remove this one
	// (the kernel takes every attribute the deletion leaves out as a wildcard).
	deletable bool
}

// Attribute values the kernel dumps for a selector that is not set.
const (
	fullMarkMask    = 0xffffffff // FRA_FWMASK of "fwmark N" without a mask
	suppressUnset   = 0xffffffff // FRA_SUPPRESS_PREFIXLEN, FRA_SUPPRESS_IFGROUP
	ruleFlagsUnused = 0
)

// listRules dumps family fam's policy rules and judges each against r. It reads
// the kernel's own attributes rather than the netlink library's Rule, which
// drops the rule's action and several selectors: a rule that only looks like
// ours must never be taken for it.
func listRules(fam int, r *redirect.Routing) ([]policyRule, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETRULE, unix.NLM_F_DUMP)
	hdr := nl.NewRtMsg()
	hdr.Family = uint8(fam)
	req.AddData(hdr)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWRULE)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	rules := make([]policyRule, 0, len(msgs))
	for _, m := range msgs {
		pr, err := judgeRule(m, r)
		if err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
		rules = append(rules, pr)
	}
	return rules, nil
}

// judgeRule reads one dumped rule (a fib_rule_hdr, laid out as an rtmsg, and
// its attributes). Ours is exactly "fwmark MARK lookup TABLE": the action is a
// table lookup of TABLE, nothing inverted, the mark MARK with the full mask or
// none, and no other selector at all (no interface, address, tos, port, uid,
// protocol, tunnel id, l3mdev, suppressor). Any attribute not known here makes
// the rule someone else's. The priority is whatever the kernel chose: we set
// none. The rule's protocol (FRA_PROTOCOL) only says who added it.
func judgeRule(m []byte, r *redirect.Routing) (policyRule, error) {
	if len(m) < unix.SizeofRtMsg {
		return policyRule{}, fmt.Errorf("a rule message of %d bytes", len(m))
	}
	h := nl.DeserializeRtMsg(m)
	attrs, err := nl.ParseRouteAttr(m[h.Len():])
	if err != nil {
		return policyRule{}, err
	}
	var pr policyRule
	table := uint32(h.Table)
	var mark, mask uint32
	hasMark, hasMask, other := false, false, false
	u32 := func(v []byte) (uint32, bool) {
		if len(v) < 4 {
			return 0, false
		}
		return binary.NativeEndian.Uint32(v), true
	}
	for _, a := range attrs {
		v, ok := u32(a.Value)
		switch a.Attr.Type {
		case nl.FRA_PRIORITY:
			pr.priority = v
		case nl.FRA_TABLE:
			table = v
		case nl.FRA_FWMARK:
			mark, hasMark = v, true
		case nl.FRA_FWMASK:
			mask, hasMask = v, true
		case nl.FRA_PROTOCOL:
			continue
		case nl.FRA_SUPPRESS_PREFIXLEN, nl.FRA_SUPPRESS_IFGROUP:
			other = other || !ok || v != suppressUnset
		default:
			other = true
		}
		if !ok && a.Attr.Type != nl.FRA_PROTOCOL {
			other = true
		}
	}
	if !hasMask && hasMark {
		mask = fullMarkMask
	}
	pr.deletable = h.Type == nl.FR_ACT_TO_TBL && table == uint32(r.Table) && hasMark && mark == r.Mark && mask == fullMarkMask
	pr.ours = pr.deletable && !other && h.Flags == ruleFlagsUnused && h.Src_len == 0 && h.Dst_len == 0 && h.Tos == 0
	return pr, nil
}

// hasRule says whether family fam holds our rule (judgeRule): the one answer
// applyRouting, verifyRouting (the plugin's CHECK, the doctor, the repair
// controller) and removeRouting act on.
func hasRule(fam int, r *redirect.Routing) (bool, error) {
	rules, err := listRules(fam, r)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(rules, func(p policyRule) bool { return p.ours }), nil
}

// deleteOurRule deletes one of our rules of family fam, if there is one, and
// says whether it tried (a deletion, a change under rtnl, as removeRouting
// counts them). It names every attribute of ours, its priority too; the
// kernel still takes those it is not given (an interface, an address, the
// invert flag) as wildcards and deletes the first rule in its order that
// matches, so when a foreign rule would be that one, it deletes nothing and
// says so.
func deleteOurRule(fam int, r *redirect.Routing) (bool, error) {
	rules, err := listRules(fam, r)
	if err != nil {
		return false, err
	}
	i := slices.IndexFunc(rules, func(p policyRule) bool { return p.ours })
	if i < 0 {
		return false, nil
	}
	prio := rules[i].priority
	if first := slices.IndexFunc(rules, func(p policyRule) bool { return p.deletable && p.priority == prio }); first != i {
		return false, fmt.Errorf("rule fwmark %d lookup %d at priority %d: another rule at that priority with the same mark and table comes first, and a deletion would remove it instead", r.Mark, r.Table, prio)
	}
	rule := tproxyRule(fam, r)
	rule.Priority = int(prio)
	rule.Type = nl.FR_ACT_TO_TBL
	mask := uint32(fullMarkMask)
	rule.Mask = &mask
	return true, netlink.RuleDel(rule)
}

// removeRouting removes the entries of which (see routingEntries) that are
// there, and says what it removed; missing entries are not errors. A rule of
// which is removed once (a failed apply removes the one it added: a racing
// apply may have added one too); with allRouting, the plugin's DEL, every rule
// of ours is. It looks before it changes anything, in ways that do not
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
func removeRouting(plan *redirect.Plan, which routingEntries) (removed []string, tried int, err error) {
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
	if p := plan.IPv6InboundPassthroughAddr; which&passthroughEntry != 0 && p.IsValid() && onLo(ifInet6, p.Addr()) && findLo() {
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
		for which&ruleEntry(fam) != 0 {
			attempted, err := deleteOurRule(fam, plan.Routing)
			if attempted {
				tried++
			}
			if err != nil {
				if !errors.Is(err, unix.EAFNOSUPPORT) {
					errs = append(errs, fmt.Errorf("remove rule fwmark %d lookup %d: %w", plan.Routing.Mark, plan.Routing.Table, err))
				}
				break
			}
			if !attempted {
				break
			}
			removed = append(removed, fmt.Sprintf("rule fwmark %d lookup %d (family %d)", plan.Routing.Mark, plan.Routing.Table, fam))
			if which != allRouting {
				break
			}
		}
		if which&routeEntry(fam) == 0 {
			continue
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
		on, err := passthroughOnLo(lo, p)
		if err != nil {
			return nil, err
		}
		if !on {
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
		found, err := hasTProxyRoute(fam, plan.Routing, lo)
		if err != nil {
			return nil, err
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("local default route via lo missing from table %d (family %d)", plan.Routing.Table, fam))
		}
	}
	return diffs, nil
}
