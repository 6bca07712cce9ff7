package redirect

import (
	"fmt"
	"net/netip"
	"slices"
)

// Build turns a spec into the ordered plan of chains and rules that Istio's sidecar
// capture programs. It is the only place where capture decisions are made; the rule
// order follows Istio's istio-iptables so that its output can be diffed against Istio's.
func Build(spec Spec) (*Plan, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("invalid redirect spec: %w", err)
	}
	b := newBuilder(spec)
	b.build()
	return b.plan()
}

// Builder state: one list of rule operations per family and table, in order.
type builder struct {
	spec     Spec
	families []Family
	ops      map[Family]map[Table][]Rule
}

func newBuilder(spec Spec) *builder {
	b := &builder{spec: spec, families: []Family{IPv4}, ops: map[Family]map[Table][]Rule{}}
	if spec.IPv6 {
		b.families = append(b.families, IPv6)
	}
	for _, f := range b.families {
		b.ops[f] = map[Table][]Rule{}
	}
	return b
}

// add appends a rule operation to family f (ignored when f is not captured).
func (b *builder) add(f Family, t Table, chain string, pos int, target Target, matches ...Match) {
	if b.ops[f] == nil {
		return
	}
	b.ops[f][t] = append(b.ops[f][t], Rule{Chain: chain, Position: pos, Matches: matches, Target: target})
}

// both appends a rule to every captured family.
func (b *builder) both(t Table, chain string, target Target, matches ...Match) {
	for _, f := range b.families {
		b.add(f, t, chain, 0, target, matches...)
	}
}

// versioned appends a rule to every family, giving each family its own value of one
// address match (Istio's AppendVersionedRule).
func (b *builder) versioned(v4, v6 netip.Prefix, t Table, chain string, target Target, matches func(p netip.Prefix) []Match) {
	b.add(IPv4, t, chain, 0, target, matches(v4)...)
	b.add(IPv6, t, chain, 0, target, matches(v6)...)
}

// Match and target constructors keep the builder readable.
func proto(p Protocol) Match         { return Match{Kind: MatchProtocol, Proto: p} }
func inIface(name string) Match      { return Match{Kind: MatchInIface, Iface: name} }
func outIface(name string) Match     { return Match{Kind: MatchOutIface, Iface: name} }
func src(p netip.Prefix) Match       { return Match{Kind: MatchSource, Prefix: p} }
func dst(p netip.Prefix) Match       { return Match{Kind: MatchDest, Prefix: p} }
func notDst(p netip.Prefix) Match    { return Match{Kind: MatchDest, Prefix: p, Negate: true} }
func dport(ports ...uint16) Match    { return Match{Kind: MatchDestPort, Ports: ports} }
func notDport(ports ...uint16) Match { return Match{Kind: MatchDestPort, Ports: ports, Negate: true} }
func sport(port uint16) Match        { return Match{Kind: MatchSourcePort, Ports: []uint16{port}} }
func uidOwner(id uint32) Match       { return Match{Kind: MatchUIDOwner, Owner: fmt.Sprint(id)} }
func notUIDOwner(id uint32) Match {
	return Match{Kind: MatchUIDOwner, Owner: fmt.Sprint(id), Negate: true}
}
func gidOwner(g string) Match    { return Match{Kind: MatchGIDOwner, Owner: g} }
func notGIDOwner(g string) Match { return Match{Kind: MatchGIDOwner, Owner: g, Negate: true} }
func mark(m uint32) Match        { return Match{Kind: MatchMark, Mark: m} }
func notMark(m uint32) Match     { return Match{Kind: MatchMark, Mark: m, Negate: true} }
func connMark(m uint32) Match    { return Match{Kind: MatchConnMark, Mark: m} }
func ctState(s ...CTState) Match { return Match{Kind: MatchCTState, CTStates: s} }

func jump(chain string) Target            { return Target{Kind: TargetJump, Chain: chain} }
func redirectTo(port uint16) Target       { return Target{Kind: TargetRedirect, Port: port} }
func setMark(m uint32) Target             { return Target{Kind: TargetSetMark, Mark: m} }
func ctZone(z uint16) Target              { return Target{Kind: TargetCTZone, Zone: z} }
func tproxy(port uint16, m uint32) Target { return Target{Kind: TargetTProxy, Port: port, Mark: m} }

var (
	ret         = Target{Kind: TargetReturn}
	accept      = Target{Kind: TargetAccept}
	drop        = Target{Kind: TargetDrop}
	saveMark    = Target{Kind: TargetSaveMark}
	restoreMark = Target{Kind: TargetRestoreMark}
)

const dnsPort = 53

func (b *builder) build() {
	s := b.spec
	tproxyMode := s.Mode == ModeTProxy
	lo4, lo6 := s.HostIPv4Loopback, LoopbackV6

	// Split CIDRs and DNS servers by family.
	var include4, include6, exclude4, exclude6 []netip.Prefix
	for _, p := range s.OutboundCIDRs.Prefixes {
		if p.Addr().Is4() {
			include4 = append(include4, p)
		} else {
			include6 = append(include6, p)
		}
	}
	for _, p := range s.OutboundCIDRsExclude {
		if p.Addr().Is4() {
			exclude4 = append(exclude4, p)
		} else {
			exclude6 = append(exclude6, p)
		}
	}
	var dns4, dns6 []netip.Addr
	for _, a := range s.DNS.Servers {
		if a.Is4() {
			dns4 = append(dns4, a)
		} else {
			dns6 = append(dns6, a)
		}
	}
	includesLoopback := slices.ContainsFunc(s.OutboundCIDRs.Prefixes, func(p netip.Prefix) bool { return p.Addr().IsLoopback() })
	// DNS capture with neither "all" nor any server to capture captures nothing (as Istio).
	redirectDNS := s.DNS.Enabled && (s.DNS.CaptureAll || len(s.DNS.Servers) > 0)

	// Excluded interfaces bypass everything.
	for _, iface := range s.ExcludeInterfaces {
		b.both(TableNAT, ChainPrerouting, ret, inIface(iface))
		b.both(TableNAT, ChainOutput, ret, outIface(iface))
	}
	if tproxyMode {
		for _, iface := range s.ExcludeInterfaces {
			b.both(TableMangle, ChainPrerouting, ret, inIface(iface))
			b.both(TableMangle, ChainOutput, ret, outIface(iface))
		}
	}
	// Traffic arriving on a rerouted virtual interface is not inbound traffic.
	for _, iface := range s.RerouteVirtualInterfaces {
		for _, f := range b.families {
			b.add(f, TableNAT, ChainPrerouting, 1, ret, inIface(iface))
		}
	}
	if s.DropInvalid {
		b.both(TableMangle, ChainPrerouting, jump(ChainDrop), ctState(CTInvalid))
		b.both(TableMangle, ChainDrop, drop)
	}
	// The tunnel port is served by the proxy directly and never captured.
	b.both(TableNAT, ChainInbound, ret, proto(TCP), dport(s.InboundTunnelPort))
	b.both(TableNAT, ChainRedirect, redirectTo(s.ProxyPort), proto(TCP))
	b.both(TableNAT, ChainInRedirect, redirectTo(s.InboundCapturePort), proto(TCP))

	b.inbound()

	b.both(TableNAT, ChainOutput, jump(ChainOutputOurs))
	for _, p := range s.OutboundPortsExclude {
		b.both(TableNAT, ChainOutputOurs, ret, proto(TCP), dport(p))
		b.both(TableNAT, ChainOutputOurs, ret, proto(UDP), dport(p))
	}
	// Inbound passthrough connections from the proxy to the app.
	b.versioned(InboundPassthroughV4, InboundPassthroughV6, TableNAT, ChainOutputOurs, ret,
		func(p netip.Prefix) []Match { return []Match{outIface("lo"), src(p)} })

	// The proxy's own traffic, by user and by group.
	type owner struct {
		match, notMatch Match
		isUID           bool
	}
	var owners []owner
	for _, uid := range s.ProxyUIDs {
		owners = append(owners, owner{uidOwner(uid), notUIDOwner(uid), true})
	}
	for _, gid := range s.ProxyGIDs {
		g := fmt.Sprint(gid)
		owners = append(owners, owner{gidOwner(g), notGIDOwner(g), false})
	}
	for _, o := range owners {
		// The proxy calling a service VIP that resolves to this pod goes back in through
		// the inbound listener. With DNS capture, port 53 stays with the agent.
		portMatch := notDport(s.InboundTunnelPort)
		if redirectDNS && o.isUID {
			portMatch = notDport(dnsPort, s.InboundTunnelPort)
		}
		b.versioned(lo4, lo6, TableNAT, ChainOutputOurs, jump(ChainInRedirect), func(p netip.Prefix) []Match {
			return []Match{outIface("lo"), notDst(p), proto(TCP), portMatch, o.match}
		})
		// App-to-self traffic over lo is not captured, unless loopback was asked for.
		if !includesLoopback {
			if redirectDNS {
				b.both(TableNAT, ChainOutputOurs, ret, outIface("lo"), proto(TCP), notDport(dnsPort), o.notMatch)
			} else {
				b.both(TableNAT, ChainOutputOurs, ret, outIface("lo"), o.notMatch)
			}
		}
		// Everything else the proxy sends leaves uncaptured.
		b.both(TableNAT, ChainOutputOurs, ret, o.match)
	}

	if s.OwnerGroups.Except {
		for _, g := range s.OwnerGroups.Groups {
			b.both(TableNAT, ChainOutputOurs, ret, gidOwner(g))
		}
	} else {
		// Only the listed groups are captured: the others return. With no group
		// listed that is a bare RETURN, so nothing below it is captured (Istio's
		// "-A ISTIO_OUTPUT -j RETURN").
		var none []Match
		for _, g := range s.OwnerGroups.Groups {
			none = append(none, notGIDOwner(g))
		}
		b.both(TableNAT, ChainOutputOurs, ret, none...)
	}

	if redirectDNS {
		b.dns(dns4, dns6, s.ProxyUIDs, s.ProxyGIDs)
	}

	b.versioned(lo4, lo6, TableNAT, ChainOutputOurs, ret, func(p netip.Prefix) []Match { return []Match{dst(p)} })
	for _, p := range exclude4 {
		b.add(IPv4, TableNAT, ChainOutputOurs, 0, ret, dst(p))
	}
	for _, p := range exclude6 {
		b.add(IPv6, TableNAT, ChainOutputOurs, 0, ret, dst(p))
	}
	for _, p := range s.OutboundPorts {
		b.both(TableNAT, ChainOutputOurs, jump(ChainRedirect), proto(TCP), dport(p))
	}
	b.outboundInclude(IPv4, include4)
	b.outboundInclude(IPv6, include6)

	if tproxyMode {
		b.tproxyMarks()
	}
}

// inbound captures inbound ports, with NAT REDIRECT or TPROXY.
func (b *builder) inbound() {
	s := b.spec
	if s.InboundPorts.Empty() {
		return
	}
	table := TableNAT
	if s.Mode == ModeTProxy {
		table = TableMangle
		b.both(TableMangle, ChainDivert, setMark(s.TProxyMark))
		b.both(TableMangle, ChainDivert, accept)
		b.versioned(s.HostIPv4Loopback, LoopbackV6, TableMangle, ChainTProxy, tproxy(s.InboundCapturePort, s.TProxyMark),
			func(p netip.Prefix) []Match { return []Match{notDst(p), proto(TCP)} })
	}
	b.both(table, ChainPrerouting, jump(ChainInbound), proto(TCP))
	capture := func(portMatch ...Match) {
		if s.Mode == ModeTProxy {
			b.both(TableMangle, ChainInbound, jump(ChainDivert), append(append([]Match{proto(TCP)}, portMatch...), ctState(CTRelated, CTEstablished))...)
			b.both(TableMangle, ChainInbound, jump(ChainTProxy), append([]Match{proto(TCP)}, portMatch...)...)
		} else {
			b.both(TableNAT, ChainInbound, jump(ChainInRedirect), append([]Match{proto(TCP)}, portMatch...)...)
		}
	}
	if s.InboundPorts.All {
		for _, p := range s.InboundPortsExclude {
			b.both(table, ChainInbound, ret, proto(TCP), dport(p))
		}
		capture()
		return
	}
	for _, p := range s.InboundPorts.Ports {
		capture(dport(p))
	}
}

// dns redirects DNS to the agent and separates the agent's upstream queries from the
// app's queries into two conntrack zones, so UDP conntrack entries cannot collide.
func (b *builder) dns(dns4, dns6 []netip.Addr, uids, gids []uint32) {
	s := b.spec
	all := s.DNS.CaptureAll
	b.both(TableRaw, ChainOutput, jump(ChainOutputDNS))
	if all || len(dns4) > 0 {
		b.add(IPv4, TableNAT, ChainOutputOurs, 0, jump(ChainOutputDNS))
	}
	if all || len(dns6) > 0 {
		b.add(IPv6, TableNAT, ChainOutputOurs, 0, jump(ChainOutputDNS))
	}
	hostRoute := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	for _, p := range []Protocol{TCP, UDP} {
		if all {
			b.both(TableNAT, ChainOutputDNS, redirectTo(s.DNSPort), proto(p), dport(dnsPort))
			continue
		}
		for _, a := range dns4 {
			b.add(IPv4, TableNAT, ChainOutputDNS, 0, redirectTo(s.DNSPort), proto(p), dport(dnsPort), dst(hostRoute(a)))
		}
		for _, a := range dns6 {
			b.add(IPv6, TableNAT, ChainOutputDNS, 0, redirectTo(s.DNSPort), proto(p), dport(dnsPort), dst(hostRoute(a)))
		}
	}
	// Zone 1: the agent and its upstream resolvers. Zone 2: the app and the agent.
	for _, uid := range uids {
		b.both(TableRaw, ChainOutputDNS, ctZone(1), proto(UDP), dport(dnsPort), uidOwner(uid))
		b.both(TableRaw, ChainOutputDNS, ctZone(2), proto(UDP), sport(s.DNSPort), uidOwner(uid))
	}
	for _, gid := range gids {
		g := fmt.Sprint(gid)
		b.both(TableRaw, ChainOutputDNS, ctZone(1), proto(UDP), dport(dnsPort), gidOwner(g))
		b.both(TableRaw, ChainOutputDNS, ctZone(2), proto(UDP), sport(s.DNSPort), gidOwner(g))
	}
	if all {
		b.both(TableRaw, ChainPrerouting, jump(ChainInbound))
		b.both(TableRaw, ChainOutputDNS, ctZone(2), proto(UDP), dport(dnsPort))
		b.both(TableRaw, ChainInbound, ctZone(1), proto(UDP), Match{Kind: MatchSourcePort, Ports: []uint16{dnsPort}})
		return
	}
	for _, fam := range []struct {
		f       Family
		servers []netip.Addr
	}{{IPv4, dns4}, {IPv6, dns6}} {
		if len(fam.servers) > 0 {
			b.add(fam.f, TableRaw, ChainPrerouting, 0, jump(ChainInbound))
		}
		for _, a := range fam.servers {
			b.add(fam.f, TableRaw, ChainOutputDNS, 0, ctZone(2), proto(UDP), dport(dnsPort), dst(hostRoute(a)))
			b.add(fam.f, TableRaw, ChainInbound, 0, ctZone(1), proto(UDP), Match{Kind: MatchSourcePort, Ports: []uint16{dnsPort}}, src(hostRoute(a)))
		}
	}
}

// outboundInclude sends the included outbound destinations of family f to the proxy.
func (b *builder) outboundInclude(f Family, prefixes []netip.Prefix) {
	s := b.spec
	if s.OutboundCIDRs.All {
		b.add(f, TableNAT, ChainOutputOurs, 0, jump(ChainRedirect))
		for _, iface := range s.RerouteVirtualInterfaces {
			b.add(f, TableNAT, ChainPrerouting, 1, jump(ChainRedirect), inIface(iface))
		}
		return
	}
	for _, p := range prefixes {
		for _, iface := range s.RerouteVirtualInterfaces {
			b.add(f, TableNAT, ChainPrerouting, 1, jump(ChainRedirect), inIface(iface), dst(p))
		}
		b.add(f, TableNAT, ChainOutputOurs, 0, jump(ChainRedirect), dst(p))
	}
}

// tproxyMarks keeps TPROXY's marks consistent: the connection remembers the inbound
// mark so replies route back to the proxy, and proxy-to-app traffic carries 1338.
func (b *builder) tproxyMarks() {
	s := b.spec
	m := s.TProxyMark
	b.both(TableMangle, ChainPrerouting, saveMark, proto(TCP), mark(m))
	b.both(TableMangle, ChainOutput, ret, proto(TCP), outIface("lo"), mark(m))
	for _, uid := range s.ProxyUIDs {
		b.versioned(s.HostIPv4Loopback, LoopbackV6, TableMangle, ChainOutput, setMark(OutboundMark),
			func(p netip.Prefix) []Match { return []Match{notDst(p), proto(TCP), outIface("lo"), uidOwner(uid)} })
	}
	for _, gid := range s.ProxyGIDs {
		g := fmt.Sprint(gid)
		b.versioned(s.HostIPv4Loopback, LoopbackV6, TableMangle, ChainOutput, setMark(OutboundMark),
			func(p netip.Prefix) []Match { return []Match{notDst(p), proto(TCP), outIface("lo"), gidOwner(g)} })
	}
	b.both(TableMangle, ChainOutput, restoreMark, proto(TCP), connMark(m))
	for _, f := range b.families {
		pass := InboundPassthroughV4
		if f == IPv6 {
			pass = InboundPassthroughV6
		}
		b.add(f, TableMangle, ChainInbound, 1, ret, proto(TCP), mark(m))
		b.add(f, TableMangle, ChainInbound, 2, ret, proto(TCP), src(pass), inIface("lo"))
		b.add(f, TableMangle, ChainInbound, 3, ret, proto(TCP), inIface("lo"), notMark(OutboundMark))
	}
}

// plan assembles the per-family tables and the chains each one creates.
func (b *builder) plan() (*Plan, error) {
	p := &Plan{}
	for _, f := range b.families {
		fp := FamilyPlan{Family: f}
		for _, t := range TableOrder {
			ops := b.ops[f][t]
			if len(ops) == 0 {
				continue
			}
			tp := TablePlan{Table: t, Rules: ops}
			for _, r := range ops {
				if !IsBuiltin(r.Chain) && !slices.Contains(tp.Chains, r.Chain) {
					tp.Chains = append(tp.Chains, r.Chain)
				}
			}
			if _, err := tp.FinalChains(); err != nil {
				return nil, fmt.Errorf("%s %s: %w", f, t, err)
			}
			fp.Tables = append(fp.Tables, tp)
		}
		p.Families = append(p.Families, fp)
	}
	if b.spec.NeedsTProxyRouting() {
		p.Routing = &Routing{Mark: b.spec.TProxyMark, Table: b.spec.TProxyRouteTable}
	}
	if b.spec.IPv6 {
		p.IPv6InboundPassthroughAddr = InboundPassthroughV6
	}
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("internal error: plan breaks an invariant: %w", err)
	}
	return p, nil
}
