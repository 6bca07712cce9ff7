package redirect

import (
	"fmt"
	"net/netip"
	"slices"
)

// Family is an IP family. Every rule in a plan belongs to exactly one.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Table is a netfilter table. Only the tables Istio's capture uses exist here.
type Table string

const (
	TableFilter Table = "filter"
	TableMangle Table = "mangle"
	TableNAT    Table = "nat"
	TableRaw    Table = "raw"
)

// TableOrder is the order tables are emitted in, the same as Istio's.
var TableOrder = []Table{TableFilter, TableMangle, TableNAT, TableRaw}

// Built-in chains (netfilter hooks) that the capture attaches to.
const (
	ChainPrerouting = "PREROUTING"
	ChainOutput     = "OUTPUT"
)

// IsBuiltin reports whether chain is a netfilter built-in chain rather than one of ours.
func IsBuiltin(chain string) bool {
	switch chain {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return false
}

// Istio's chain names. They are kept so that existing debugging guides keep working.
const (
	ChainInbound    = "ISTIO_INBOUND"
	ChainRedirect   = "ISTIO_REDIRECT"
	ChainInRedirect = "ISTIO_IN_REDIRECT"
	ChainOutputOurs = "ISTIO_OUTPUT"
	ChainOutputDNS  = "ISTIO_OUTPUT_DNS"
	ChainDivert     = "ISTIO_DIVERT"
	ChainTProxy     = "ISTIO_TPROXY"
	ChainDrop       = "ISTIO_DROP"
)

// ChainPrefix marks every chain this project owns.
const ChainPrefix = "ISTIO_"

// Protocol is a layer 4 protocol a rule can match.
type Protocol string

const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// MatchKind says which field of a Match is meaningful.
type MatchKind uint8

const (
	MatchProtocol   MatchKind = iota + 1 // Proto
	MatchInIface                         // Iface
	MatchOutIface                        // Iface
	MatchSource                          // Prefix
	MatchDest                            // Prefix
	MatchDestPort                        // Ports; more than one port is a multiport match
	MatchSourcePort                      // Ports
	MatchUIDOwner                        // Owner (numeric uid)
	MatchGIDOwner                        // Owner (numeric gid or group name)
	MatchMark                            // Mark
	MatchConnMark                        // Mark
	MatchCTState                         // CTStates
)

// CTState is a conntrack state.
type CTState string

const (
	CTInvalid     CTState = "INVALID"
	CTRelated     CTState = "RELATED"
	CTEstablished CTState = "ESTABLISHED"
)

// Match is one typed condition of a rule. All matches of a rule must hold (logical AND).
// Port-, owner- and state-lists come from validated input only; nothing here is free text.
type Match struct {
	Kind     MatchKind
	Negate   bool
	Proto    Protocol     `json:",omitempty"`
	Iface    string       `json:",omitempty"`
	Prefix   netip.Prefix `json:",omitzero"`
	Ports    []uint16     `json:",omitempty"`
	Owner    string       `json:",omitempty"`
	Mark     uint32       `json:",omitempty"`
	CTStates []CTState    `json:",omitempty"`
}

// TargetKind is what a rule does with a matching packet.
type TargetKind uint8

const (
	TargetJump        TargetKind = iota + 1 // Chain
	TargetReturn                            // leave the chain
	TargetAccept                            //
	TargetDrop                              //
	TargetRedirect                          // Port: NAT to a local port
	TargetTProxy                            // Port, Mark: transparent proxy, marking the packet
	TargetSetMark                           // Mark
	TargetSaveMark                          // copy packet mark to connection mark
	TargetRestoreMark                       // copy connection mark to packet mark
	TargetCTZone                            // Zone: conntrack zone
)

// Target is a rule's verdict or action.
type Target struct {
	Kind  TargetKind
	Chain string `json:",omitempty"`
	Port  uint16 `json:",omitempty"`
	Mark  uint32 `json:",omitempty"`
	Zone  uint16 `json:",omitempty"`
}

// Rule is one rule of a chain. Position 0 appends; Position N > 0 inserts at
// 1-based position N at the moment the rule is added, as Istio does with `-I CHAIN N`.
type Rule struct {
	Chain    string
	Position int `json:",omitempty"`
	Matches  []Match
	Target   Target
}

// TablePlan is everything one family needs in one table: our chains, in the order
// they are first used, and the rule operations in order.
type TablePlan struct {
	Table  Table
	Chains []string
	Rules  []Rule
}

// FamilyPlan holds the tables of one family in TableOrder. Empty tables are left out.
type FamilyPlan struct {
	Family Family
	Tables []TablePlan
}

// Routing is the policy routing TPROXY needs: packets carrying Mark are looked up in
// Table, whose default route delivers them locally.
type Routing struct {
	Mark  uint32
	Table int
}

// Plan is the complete, ordered description of a capture. Backends translate it; they
// never decide anything.
type Plan struct {
	Families []FamilyPlan
	// Routing is set when Spec.NeedsTProxyRouting.
	Routing *Routing `json:",omitempty"`
	// IPv6InboundPassthroughAddr is added to lo when IPv6 is on: it is the source
	// address the proxy binds for inbound passthrough (Istio's ::6).
	IPv6InboundPassthroughAddr netip.Prefix `json:",omitzero"`
}

// Family returns the plan for f, or nil when f is not captured.
func (p *Plan) Family(f Family) *FamilyPlan {
	if i := slices.IndexFunc(p.Families, func(fp FamilyPlan) bool { return fp.Family == f }); i >= 0 {
		return &p.Families[i]
	}
	return nil
}

// Table returns the plan of table t, or nil when the family has no rules there.
func (fp *FamilyPlan) Table(t Table) *TablePlan {
	if i := slices.IndexFunc(fp.Tables, func(tp TablePlan) bool { return tp.Table == t }); i >= 0 {
		return &fp.Tables[i]
	}
	return nil
}

// FinalChains replays the table's rule operations (appends and positional inserts)
// and returns every chain's resulting rule list, keyed by chain name. Chains with no
// rules are absent. The returned rules have Position 0.
func (tp *TablePlan) FinalChains() (map[string][]Rule, error) {
	return Replay(tp.Rules)
}

// Replay applies rule operations in order, as iptables would, and returns the
// resulting chains. It fails when an insert position is beyond the chain's end.
func Replay(ops []Rule) (map[string][]Rule, error) {
	out := map[string][]Rule{}
	for _, r := range ops {
		cur := out[r.Chain]
		r2 := r
		r2.Position = 0
		switch {
		case r.Position == 0:
			cur = append(cur, r2)
		case r.Position-1 <= len(cur):
			cur = slices.Insert(cur, r.Position-1, r2)
		default:
			return nil, fmt.Errorf("insert into %s at position %d: chain has only %d rules", r.Chain, r.Position, len(cur))
		}
		out[r.Chain] = cur
	}
	return out, nil
}
