package iptables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Native writes: in nft mode, iptables-restore turns its input into nftables
// objects and sends them to the kernel in one netlink batch. For a pod's new
// namespace (no ip/ip6 table yet) the plugin sends that same batch itself,
// saving the restore process (about half of an iptables-mode ADD). The objects
// are the ones iptables-nft writes for the same restore input, expression for
// expression, so iptables-save, iptables -L, CHECK (which reads with
// iptables-save) and every debugging guide see exactly what a restore would have
// left; TestNativeWritesEqualIptablesRestore proves it per case against the
// node's iptables-nft-restore. What this translation does not cover (marks,
// conntrack, TPROXY, CT zones, multiport, owner names, the mangle and raw
// tables) goes through iptables-restore as before: errNotNative.

// errNotNative says a layout holds something the native writer does not
// translate; the caller restores it instead.
var errNotNative = errors.New("not written natively")

// natBaseChains are iptables-nft's built-in chains of the nat table: hook and
// priority (NF_IP_PRI_NAT_DST -100, NF_IP_PRI_NAT_SRC 100).
var natBaseChains = map[string]struct {
	hook *gnft.ChainHook
	prio *gnft.ChainPriority
}{
	"PREROUTING":  {gnft.ChainHookPrerouting, gnft.ChainPriorityNATDest},
	"INPUT":       {gnft.ChainHookInput, gnft.ChainPriorityNATSource},
	"OUTPUT":      {gnft.ChainHookOutput, gnft.ChainPriorityNATDest},
	"POSTROUTING": {gnft.ChainHookPostrouting, gnft.ChainPriorityNATSource},
}

// Kernel constants of the xtables structures the compat expressions carry.
const (
	xtOwnerUID               = 0x1 // XT_OWNER_UID
	xtOwnerGID               = 0x2 // XT_OWNER_GID
	nfNATRangeProtoSpecified = 0x2 // NF_NAT_RANGE_PROTO_SPECIFIED
)

// nativeObjects is one family's batch: the table, its chains in creation order and
// the rules in order.
type nativeObjects struct {
	table  *gnft.Table
	chains []*gnft.Chain
	rules  []*gnft.Rule
}

// translateNative builds the objects iptables-nft-restore creates for
// restoreText(want, nil) in an empty namespace, or errNotNative.
func translateNative(f redirect.Family, want []tableLayout) ([]nativeObjects, error) {
	fam := gnft.TableFamilyIPv4
	if f == redirect.IPv6 {
		fam = gnft.TableFamilyIPv6
	}
	var out []nativeObjects
	for _, tl := range want {
		if tl.Table != redirect.TableNAT {
			return nil, fmt.Errorf("%w: table %s", errNotNative, tl.Table)
		}
		objs := nativeObjects{table: &gnft.Table{Name: string(tl.Table), Family: fam}}
		chains := map[string]*gnft.Chain{}
		chain := func(name string) *gnft.Chain {
			if c, ok := chains[name]; ok {
				return c
			}
			c := &gnft.Chain{Name: name, Table: objs.table}
			if base, ok := natBaseChains[name]; ok {
				accept := gnft.ChainPolicyAccept
				c.Type, c.Hooknum, c.Priority, c.Policy = gnft.ChainTypeNAT, base.hook, base.prio, &accept
			}
			chains[name] = c
			objs.chains = append(objs.chains, c)
			return c
		}
		add := func(r redirect.Rule) error {
			c := chain(r.Chain)
			exprs, err := ruleExprs(f, r)
			if err != nil {
				return err
			}
			objs.rules = append(objs.rules, &gnft.Rule{Table: objs.table, Chain: c, Exprs: exprs})
			return nil
		}
		// restoreText's order: our chains declared, then the hook rules (each
		// creates its built-in chain), then our chains' rules.
		for _, c := range tl.Chains {
			if redirect.IsBuiltin(c) {
				return nil, fmt.Errorf("%w: built-in chain %s among ours", errNotNative, c)
			}
			chain(c)
		}
		for _, builtin := range []string{redirect.ChainPrerouting, redirect.ChainOutput} {
			if h, ok := tl.Hooks[builtin]; ok {
				if err := add(h); err != nil {
					return nil, err
				}
			}
		}
		for _, c := range tl.Chains {
			for _, r := range tl.Rules[c] {
				if err := add(r); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, objs)
	}
	return out, nil
}

// ruleExprs is iptables-nft's encoding of one rule: interfaces, protocol,
// addresses (the IP header part, in that order whatever the order on the command
// line), then the matches in their order, a counter, and the target.
func ruleExprs(f redirect.Family, r redirect.Rule) ([]expr.Any, error) {
	var in, out, proto, src, dst *redirect.Match
	var matches []redirect.Match
	once := func(p **redirect.Match, m redirect.Match) error {
		if *p != nil {
			return fmt.Errorf("%w: two matches of kind %d in one rule", errNotNative, m.Kind)
		}
		*p = &m
		return nil
	}
	ports := 0
	for _, m := range r.Matches {
		var err error
		switch m.Kind {
		case redirect.MatchInIface, redirect.MatchOutIface:
			if strings.HasSuffix(m.Iface, "+") {
				return nil, fmt.Errorf("%w: interface prefix %s", errNotNative, m.Iface)
			}
			if m.Kind == redirect.MatchInIface {
				err = once(&in, m)
			} else {
				err = once(&out, m)
			}
		case redirect.MatchProtocol:
			err = once(&proto, m)
		case redirect.MatchSource:
			err = once(&src, m)
		case redirect.MatchDest:
			err = once(&dst, m)
		case redirect.MatchDestPort, redirect.MatchSourcePort:
			ports++
			if len(m.Ports) != 1 || ports > 1 {
				return nil, fmt.Errorf("%w: port match %v", errNotNative, m.Ports)
			}
			matches = append(matches, m)
		case redirect.MatchUIDOwner, redirect.MatchGIDOwner:
			matches = append(matches, m)
		default:
			return nil, fmt.Errorf("%w: match kind %d", errNotNative, m.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	var e []expr.Any
	if in != nil {
		e = append(e, ifaceExprs(expr.MetaKeyIIFNAME, *in)...)
	}
	if out != nil {
		e = append(e, ifaceExprs(expr.MetaKeyOIFNAME, *out)...)
	}
	var protoNum byte
	if proto != nil {
		switch proto.Proto {
		case redirect.TCP:
			protoNum = unix.IPPROTO_TCP
		case redirect.UDP:
			protoNum = unix.IPPROTO_UDP
		default:
			return nil, fmt.Errorf("%w: protocol %s", errNotNative, proto.Proto)
		}
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: cmpOp(proto.Negate), Register: 1, Data: []byte{protoNum}})
	}
	srcOff, dstOff := uint32(12), uint32(16)
	if f == redirect.IPv6 {
		srcOff, dstOff = 8, 24
	}
	for _, a := range []struct {
		m   *redirect.Match
		off uint32
	}{{src, srcOff}, {dst, dstOff}} {
		if a.m == nil {
			continue
		}
		x, err := addrExprs(f, *a.m, a.off)
		if err != nil {
			return nil, err
		}
		e = append(e, x...)
	}
	for _, m := range matches {
		switch m.Kind {
		case redirect.MatchDestPort, redirect.MatchSourcePort:
			if proto == nil || proto.Negate {
				return nil, fmt.Errorf("%w: a port match without -p tcp or -p udp", errNotNative)
			}
			off := uint32(2)
			if m.Kind == redirect.MatchSourcePort {
				off = 0
			}
			e = append(e,
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
				&expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: binary.BigEndian.AppendUint16(nil, m.Ports[0])})
		case redirect.MatchUIDOwner, redirect.MatchGIDOwner:
			x, err := ownerMatch(m)
			if err != nil {
				return nil, err
			}
			e = append(e, x)
		}
	}
	e = append(e, &expr.Counter{})
	t, err := targetExpr(f, r.Target)
	if err != nil {
		return nil, err
	}
	return append(e, t), nil
}

func cmpOp(negate bool) expr.CmpOp {
	if negate {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// ifaceExprs compares the interface name as iptables-nft does for a full name:
// with its terminating NUL. (A name ending in "+", iptables' prefix match, is
// not a name the capture settings accept; ruleExprs leaves it to iptables.)
func ifaceExprs(key expr.MetaKey, m redirect.Match) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: append([]byte(m.Iface), 0)}}
}

// addrExprs compares a source or destination prefix as iptables-nft does: a
// byte-aligned prefix loads only its bytes; any other loads the whole address and
// masks it. A /0 that is not negated matches everything and is left out, as
// iptables leaves it out.
func addrExprs(f redirect.Family, m redirect.Match, off uint32) ([]expr.Any, error) {
	p := m.Prefix.Masked()
	addr := p.Addr()
	if (f == redirect.IPv4) != addr.Is4() {
		return nil, fmt.Errorf("%w: %s address in an %s rule", errNotNative, p, f)
	}
	if p.Bits() == 0 && !m.Negate {
		return nil, nil
	}
	data := addr.AsSlice()
	size := len(data)
	if p.Bits()%8 == 0 {
		n := p.Bits() / 8
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(n)},
			&expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: data[:n]},
		}, nil
	}
	mask := make([]byte, size)
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(size)},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(size), Mask: mask, Xor: make([]byte, size)},
		&expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: data},
	}, nil
}

// ownerMatch is xt_owner revision 1 (struct xt_owner_match_info: uid_min,
// uid_max, gid_min, gid_max, match, invert, in host order, padded to 8 bytes).
// Only a numeric id: a name is the node's to resolve, which iptables does.
func ownerMatch(m redirect.Match) (expr.Any, error) {
	id, err := strconv.ParseUint(m.Owner, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%w: owner %q is not numeric", errNotNative, m.Owner)
	}
	info := make([]byte, 24)
	flag := byte(xtOwnerUID)
	at := 0
	if m.Kind == redirect.MatchGIDOwner {
		flag, at = xtOwnerGID, 8
	}
	binary.NativeEndian.PutUint32(info[at:], uint32(id))
	binary.NativeEndian.PutUint32(info[at+4:], uint32(id))
	info[16] = flag
	if m.Negate {
		info[17] = flag
	}
	u := xt.Unknown(info)
	return &expr.Match{Name: "owner", Rev: 1, Info: &u}, nil
}

// targetExpr is the rule's verdict, or REDIRECT revision 0: for IPv4 struct
// nf_nat_ipv4_multi_range_compat (rangesize 1, one range: flags, min_ip,
// max_ip, min and max port), for IPv6 struct nf_nat_range (flags, min_addr,
// max_addr, min and max port); integers in host order, ports in network order.
func targetExpr(f redirect.Family, t redirect.Target) (expr.Any, error) {
	switch t.Kind {
	case redirect.TargetJump:
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: t.Chain}, nil
	case redirect.TargetReturn:
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	case redirect.TargetAccept:
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case redirect.TargetDrop:
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case redirect.TargetRedirect:
		var info []byte
		if f == redirect.IPv4 {
			info = make([]byte, 24)
			binary.NativeEndian.PutUint32(info[0:], 1)
			binary.NativeEndian.PutUint32(info[4:], nfNATRangeProtoSpecified)
			binary.BigEndian.PutUint16(info[16:], t.Port)
			binary.BigEndian.PutUint16(info[18:], t.Port)
		} else {
			info = make([]byte, 40)
			binary.NativeEndian.PutUint32(info[0:], nfNATRangeProtoSpecified)
			binary.BigEndian.PutUint16(info[36:], t.Port)
			binary.BigEndian.PutUint16(info[38:], t.Port)
		}
		u := xt.Unknown(info)
		return &expr.Target{Name: "REDIRECT", Rev: 0, Info: &u}, nil
	}
	return nil, fmt.Errorf("%w: target kind %d", errNotNative, t.Kind)
}

// writeNative sends one family's objects in one batch over a netlink socket of
// the calling thread's namespace: the kernel applies all of it or none. It is
// only called for a family that had no table when Apply looked, and it creates
// each table exclusively: if another apply wrote the family's tables since,
// the kernel refuses the whole batch (EEXIST) instead of adding every rule a
// second time to the other apply's chains, and Apply reads what is there.
func writeNative(objs []nativeObjects) error {
	c, err := nftables.DialHere()
	if err != nil {
		return err
	}
	defer c.Close()
	for _, o := range objs {
		c.CreateTable(o.table)
		for _, ch := range o.chains {
			c.AddChain(ch)
		}
		for _, r := range o.rules {
			c.AddRule(r)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables batch: %w", err)
	}
	return nil
}

// errIstioRulesToRead is cleanupNative's answer for a family whose built-in chains
// hold a rule that may be one of those Istio's layout writes there: the restore
// path reads it as text and removes it if it is (istioBuiltinForm).
var errIstioRulesToRead = errors.New("a built-in chain holds a rule that may be Istio's: left to the restore to read")

// cleanupNative removes our chains, and the rules of the built-in chains that
// jump to them, from family f's iptables-nft tables in the calling thread's
// namespace, in one netlink transaction: what restoring restoreText(nil, live)
// does (our chains flushed, the hook rules deleted, our chains deleted), without
// the save and the restore processes, which a DEL in iptables mode spent most of
// its time in. Every other chain and rule is left alone, as by the restore. The
// transaction applies whole or not at all: on an error nothing changed, and the
// caller removes the rules with the restore instead. A namespace Istio programmed
// also holds rules of its in built-in chains; when one may be there
// (mayBeIstios), nothing is sent and errIstioRulesToRead leaves the family to the
// restore.
func cleanupNative(f redirect.Family) error {
	fam := gnft.TableFamilyIPv4
	if f == redirect.IPv6 {
		fam = gnft.TableFamilyIPv6
	}
	c, err := nftables.DialHere()
	if err != nil {
		return err
	}
	defer c.Close()
	chains, err := c.ListChainsOfTableFamily(fam)
	if err != nil {
		return fmt.Errorf("list %s chains: %w", f, err)
	}
	byTable := map[string][]*gnft.Chain{}
	var tables []string
	programmed := false
	for _, ch := range chains {
		if ch.Table == nil {
			continue
		}
		if _, ok := byTable[ch.Table.Name]; !ok {
			tables = append(tables, ch.Table.Name)
		}
		byTable[ch.Table.Name] = append(byTable[ch.Table.Name], ch)
		programmed = programmed || isOurs(ch.Name)
	}
	if !programmed {
		return nil // no chain of ours, so no rule can jump to one, and Istio was not here
	}
	var hooks []*gnft.Rule
	var mine []*gnft.Chain
	for _, t := range tables {
		for _, ch := range byTable[t] {
			if isOurs(ch.Name) {
				mine = append(mine, ch)
				continue
			}
			if !redirect.IsBuiltin(ch.Name) {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return fmt.Errorf("list %s rules of %s %s: %w", f, t, ch.Name, err)
			}
			for _, r := range rules {
				switch {
				case jumpsToOurs(r):
					hooks = append(hooks, r)
				case (t == string(redirect.TableNAT) || t == string(redirect.TableMangle)) && mayBeIstios(r):
					return errIstioRulesToRead
				}
			}
		}
	}
	for _, r := range hooks {
		if err := c.DelRule(r); err != nil {
			return fmt.Errorf("delete a %s rule of %s %s: %w", f, r.Table.Name, r.Chain.Name, err)
		}
	}
	for _, ch := range mine {
		c.FlushChain(ch)
	}
	for _, ch := range mine {
		c.DelChain(ch)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables batch: %w", err)
	}
	return nil
}

// mayBeIstios says whether r could be one of the fixed forms Istio writes into
// built-in chains (istioBuiltinForm): all of them return or set the packet or
// connection mark, and none matches a port. It only chooses between the native
// removal and the restore; the restore decides from the rule's text.
func mayBeIstios(r *gnft.Rule) bool {
	effect := false
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Payload:
			if e.Base == expr.PayloadBaseTransportHeader {
				return false
			}
		case *expr.Match:
			return false // an xtables match iptables-nft did not translate: not Istio's forms
		case *expr.Verdict:
			effect = effect || e.Kind == expr.VerdictReturn
		case *expr.Meta:
			effect = effect || e.SourceRegister && e.Key == expr.MetaKeyMARK
		case *expr.Ct:
			effect = effect || e.SourceRegister && e.Key == expr.CtKeyMARK
		case *expr.Target:
			effect = effect || e.Name == "MARK" || e.Name == "CONNMARK"
		}
	}
	return effect
}

// jumpsToOurs says whether r jumps or goes to one of our chains: iptables-nft
// writes "-j CHAIN" and "-g CHAIN" as an nftables verdict naming the chain.
func jumpsToOurs(r *gnft.Rule) bool {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && isOurs(v.Chain) {
			return true
		}
	}
	return false
}

// nativeMinVersion is the oldest iptables-nft whose reading of these objects is
// known: they are what 1.8.9 writes (TestNativeWritesEqualIptablesRestore
// compares with the node's own restore), and later versions read what earlier
// ones wrote. With an older or unknown version the rules are restored.
var nativeMinVersion = [3]int{1, 8, 9}

// VersionTempPrefix starts the name of the temporary file the node's iptables-nft
// version is written to before its rename into nativeVersionFile.
const VersionTempPrefix = ".version-"

// RemoveAbandonedVersionTemps removes from dir (Config.NativeStateDir) the
// temporary files of the node's iptables-nft version that a killed plugin left,
// never one a live writer holds (livetemp), and returns how many it removed. The
// plugin's GC and the agent's start both run it.
func RemoveAbandonedVersionTemps(dir string) (removed int) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), VersionTempPrefix) {
			if ok, _ := livetemp.RemoveAbandoned(filepath.Join(dir, e.Name())); ok {
				removed++
			}
		}
	}
	return removed
}

// nativeVersionFile remembers, in Config.NativeStateDir, the version of the
// restore binary it was read from: "<path> <size> <mtime ns> <version>". A
// binary replaced on the node (another size or time) is asked again.
const nativeVersionFile = "iptables-nft-version"

// versionBound bounds asking the binary its version (once per node and binary); a
// binary that does not answer in time leaves the writes to the restore.
const versionBound = 5 * time.Second

// nativeAllowed says whether this backend writes new namespaces natively: nft
// mode, a state directory to remember the version in, and an iptables-nft of
// at least nativeMinVersion. It asks the binary once per node and binary (about
// a millisecond), then reads the remembered answer.
func (b *Backend) nativeAllowed() bool {
	b.nativeOnce.Do(func() {
		if b.mode != ModeNFT || b.nativeDir == "" || !b.tools[redirect.IPv4].flavoured {
			return
		}
		v, err := b.restoreVersion()
		if err != nil {
			return
		}
		b.native = compareVersion(v, nativeMinVersion) >= 0
	})
	return b.native
}

// NativeWrites says whether this backend writes new namespaces natively, asking
// the node's iptables-nft-restore its version if no run asked it before (see
// nativeAllowed). The plugin's STATUS calls it, so that the pods after an
// install or a reboot find the answer remembered instead of each running the
// binary at the start of a burst.
func (b *Backend) NativeWrites() bool { return b.nativeAllowed() }

// restoreVersion is the version of the mode's restore binary: iptables-nft's
// for native writes, iptables-legacy's for its lock (masksNodeLock). It is
// remembered in Config.NativeStateDir, when set, per mode.
func (b *Backend) restoreVersion() ([3]int, error) {
	file, flavour := nativeVersionFile, "(nf_tables)"
	if b.mode == ModeLegacy {
		file, flavour = legacyVersionFile, "(legacy)"
	}
	bin := b.tools[redirect.IPv4].restore
	st, err := os.Stat(bin)
	if err != nil {
		return [3]int{}, err
	}
	key := fmt.Sprintf("%s %d %d", bin, st.Size(), st.ModTime().UnixNano())
	path := filepath.Join(b.nativeDir, file)
	if b.nativeDir == "" {
		path = ""
	} else if data, err := os.ReadFile(path); err == nil && len(data) < 4096 {
		if k, v, ok := strings.Cut(strings.TrimSpace(string(data)), " v"); ok && k == key {
			return parseFlavourVersion("v"+v+" "+flavour, flavour)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.WaitDelay = RunWaitDelay
	out, err := cmd.Output()
	if err != nil {
		return [3]int{}, fmt.Errorf("%s --version (bound %v): %w", bin, versionBound, err)
	}
	v, err := parseFlavourVersion(string(out), flavour)
	if err != nil {
		return v, err
	}
	// Remembered for the next runs; a failure to write only costs them the exec.
	if path == "" {
		return v, nil
	}
	if err := os.MkdirAll(b.nativeDir, 0o755); err == nil {
		// Locked until after the rename: the plugin's GC removes a killed writer's
		// temporary (VersionTempPrefix), never a live one's.
		if f, release, err := livetemp.CreateTemp(b.nativeDir, VersionTempPrefix+"*"); err == nil {
			_, werr := fmt.Fprintf(f, "%s v%d.%d.%d\n", key, v[0], v[1], v[2])
			if cerr := f.Close(); werr == nil && cerr == nil {
				werr = os.Rename(f.Name(), path)
			}
			if werr != nil {
				os.Remove(f.Name())
			}
			release()
		}
	}
	return v, nil
}

// parseVersion reads `iptables-nft-restore --version`, "iptables-nft-restore
// v1.8.9 (nf_tables)": the first "v<major>.<minor>.<patch>" followed, later on the
// line, by "(nf_tables)". (Written out rather than as a regular expression: a
// package-level one is compiled at every start of the plugin, which is exec'd
// once per pod.)
func parseVersion(s string) ([3]int, error) { return parseFlavourVersion(s, "(nf_tables)") }

// parseFlavourVersion is parseVersion for the flavour its --version names:
// "(nf_tables)" or "(legacy)".
func parseFlavourVersion(s, flavour string) ([3]int, error) {
	for i := strings.IndexByte(s, 'v'); i >= 0; {
		if v, rest, ok := versionAt(s[i+1:]); ok && strings.Contains(rest, flavour) {
			return v, nil
		}
		next := strings.IndexByte(s[i+1:], 'v')
		if next < 0 {
			break
		}
		i += 1 + next
	}
	return [3]int{}, fmt.Errorf("not an iptables %s version: %q", flavour, strings.TrimSpace(s))
}

// versionAt reads "<major>.<minor>.<patch>" at the start of s, and what follows.
func versionAt(s string) (v [3]int, rest string, ok bool) {
	for i := range v {
		if i > 0 {
			if !strings.HasPrefix(s, ".") {
				return v, s, false
			}
			s = s[1:]
		}
		n := 0
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		if n == 0 || n > 9 {
			return v, s, false
		}
		v[i], _ = strconv.Atoi(s[:n])
		s = s[n:]
	}
	return v, s, true
}

func compareVersion(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			return a[i] - b[i]
		}
	}
	return 0
}
