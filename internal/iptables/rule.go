package iptables

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// RuleArgs renders a rule's matches and target as iptables arguments, without the
// leading "-A CHAIN". Matches keep the plan's order, which follows Istio's.
func RuleArgs(r redirect.Rule) []string {
	var a []string
	for _, m := range r.Matches {
		a = append(a, matchArgs(m)...)
	}
	return append(a, targetArgs(r.Target)...)
}

func neg(m redirect.Match, args ...string) []string {
	if m.Negate {
		return append([]string{"!"}, args...)
	}
	return args
}

func joinPorts(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func matchArgs(m redirect.Match) []string {
	switch m.Kind {
	case redirect.MatchProtocol:
		return neg(m, "-p", string(m.Proto))
	case redirect.MatchInIface:
		return neg(m, "-i", m.Iface)
	case redirect.MatchOutIface:
		return neg(m, "-o", m.Iface)
	case redirect.MatchSource:
		return neg(m, "-s", m.Prefix.String())
	case redirect.MatchDest:
		return neg(m, "-d", m.Prefix.String())
	case redirect.MatchDestPort:
		if len(m.Ports) > 1 {
			return append([]string{"-m", "multiport"}, neg(m, "--dports", joinPorts(m.Ports))...)
		}
		return neg(m, "--dport", joinPorts(m.Ports))
	case redirect.MatchSourcePort:
		if len(m.Ports) > 1 {
			return append([]string{"-m", "multiport"}, neg(m, "--sports", joinPorts(m.Ports))...)
		}
		return neg(m, "--sport", joinPorts(m.Ports))
	case redirect.MatchUIDOwner:
		return append([]string{"-m", "owner"}, neg(m, "--uid-owner", m.Owner)...)
	case redirect.MatchGIDOwner:
		return append([]string{"-m", "owner"}, neg(m, "--gid-owner", m.Owner)...)
	case redirect.MatchMark:
		return append([]string{"-m", "mark"}, neg(m, "--mark", strconv.FormatUint(uint64(m.Mark), 10))...)
	case redirect.MatchConnMark:
		return append([]string{"-m", "connmark"}, neg(m, "--mark", strconv.FormatUint(uint64(m.Mark), 10))...)
	case redirect.MatchCTState:
		states := make([]string, len(m.CTStates))
		for i, s := range m.CTStates {
			states[i] = string(s)
		}
		return append([]string{"-m", "conntrack"}, neg(m, "--ctstate", strings.Join(states, ","))...)
	}
	panic(fmt.Sprintf("iptables: unknown match kind %d", m.Kind))
}

func targetArgs(t redirect.Target) []string {
	switch t.Kind {
	case redirect.TargetJump:
		return []string{"-j", t.Chain}
	case redirect.TargetReturn:
		return []string{"-j", "RETURN"}
	case redirect.TargetAccept:
		return []string{"-j", "ACCEPT"}
	case redirect.TargetDrop:
		return []string{"-j", "DROP"}
	case redirect.TargetRedirect:
		return []string{"-j", "REDIRECT", "--to-ports", strconv.Itoa(int(t.Port))}
	case redirect.TargetTProxy:
		return []string{"-j", "TPROXY", "--tproxy-mark", fmt.Sprintf("%d/0xffffffff", t.Mark), "--on-port", strconv.Itoa(int(t.Port))}
	case redirect.TargetSetMark:
		return []string{"-j", "MARK", "--set-mark", strconv.FormatUint(uint64(t.Mark), 10)}
	case redirect.TargetSaveMark:
		return []string{"-j", "CONNMARK", "--save-mark"}
	case redirect.TargetRestoreMark:
		return []string{"-j", "CONNMARK", "--restore-mark"}
	case redirect.TargetCTZone:
		return []string{"-j", "CT", "--zone", strconv.Itoa(int(t.Zone))}
	}
	panic(fmt.Sprintf("iptables: unknown target kind %d", t.Kind))
}

// RenderPlanText renders one family's plan as Istio's istio-iptables renders it: per
// table "* table", "-N" for each chain of ours, then every rule operation in order
// ("-A" appends, "-I CHAIN N" inserts), and COMMIT. This is the --dry-run output and
// the text to diff against Istio's.
func RenderPlanText(fp *redirect.FamilyPlan) string {
	var b strings.Builder
	for _, tp := range fp.Tables {
		fmt.Fprintf(&b, "* %s\n", tp.Table)
		for _, c := range tp.Chains {
			fmt.Fprintf(&b, "-N %s\n", c)
		}
		for _, r := range tp.Rules {
			if r.Position > 0 {
				fmt.Fprintf(&b, "-I %s %d %s\n", r.Chain, r.Position, strings.Join(RuleArgs(r), " "))
			} else {
				fmt.Fprintf(&b, "-A %s %s\n", r.Chain, strings.Join(RuleArgs(r), " "))
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
