package iptables

import (
	"bufio"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// ParseRuleArgs parses the arguments of one rule, as Istio writes them or as
// iptables-save prints them (which adds "-m tcp", writes marks in hex and expands
// target defaults), back into a typed rule. Anything it does not understand is an
// error: verify must never pass a rule it could not read.
func ParseRuleArgs(chain string, args []string) (redirect.Rule, error) {
	r := redirect.Rule{Chain: chain}
	negate := false
	next := func(i *int, opt string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("option %s without a value", opt)
		}
		*i++
		return args[*i], nil
	}
	add := func(m redirect.Match) {
		m.Negate = negate
		negate = false
		r.Matches = append(r.Matches, m)
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "!":
			negate = true
			continue
		case "-p", "--protocol", "-i", "--in-interface", "-o", "--out-interface", "-s", "--source", "-d", "--destination",
			"--dport", "--destination-port", "--sport", "--source-port", "--dports", "--sports",
			"--uid-owner", "--gid-owner", "--mark", "--ctstate":
			v, err := next(&i, a)
			if err != nil {
				return r, err
			}
			m, err := parseMatch(a, v, r.Matches)
			if err != nil {
				return r, fmt.Errorf("%s %s: %w", a, v, err)
			}
			add(m)
		case "-m", "--match":
			v, err := next(&i, a)
			if err != nil {
				return r, err
			}
			switch v {
			case "tcp", "udp", "multiport", "owner", "mark", "connmark", "conntrack":
			default:
				return r, fmt.Errorf("unsupported match module %q", v)
			}
			// The module decides how "--mark" reads; remember it in a marker match.
			if v == "connmark" || v == "mark" {
				r.Matches = append(r.Matches, redirect.Match{Kind: markModule(v)})
			}
		case "-j", "--jump":
			v, err := next(&i, a)
			if err != nil {
				return r, err
			}
			t, n, err := parseTarget(v, args[i+1:])
			if err != nil {
				return r, fmt.Errorf("target %s: %w", v, err)
			}
			r.Target = t
			i += n
		default:
			return r, fmt.Errorf("unsupported argument %q", a)
		}
	}
	if r.Target.Kind == 0 {
		return r, fmt.Errorf("rule has no target")
	}
	// Drop the module markers.
	out := r.Matches[:0]
	for _, m := range r.Matches {
		if m.Kind != markerMark && m.Kind != markerConnMark {
			out = append(out, m)
		}
	}
	r.Matches = out
	return r, nil
}

// Private marker kinds, never left in a parsed rule.
const (
	markerMark     redirect.MatchKind = 200
	markerConnMark redirect.MatchKind = 201
)

func markModule(name string) redirect.MatchKind {
	if name == "connmark" {
		return markerConnMark
	}
	return markerMark
}

func parsePorts(v string) ([]uint16, error) {
	var out []uint16
	for _, p := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("bad port %q", p)
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

func parseMark(v string) (uint32, error) {
	val, mask, hasMask := strings.Cut(v, "/")
	n, err := strconv.ParseUint(val, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("bad mark %q", v)
	}
	if hasMask {
		m, err := strconv.ParseUint(mask, 0, 32)
		if err != nil || m != 0xffffffff {
			return 0, fmt.Errorf("unsupported mark mask %q", mask)
		}
	}
	return uint32(n), nil
}

func parseMatch(opt, v string, prev []redirect.Match) (redirect.Match, error) {
	switch opt {
	case "-p", "--protocol":
		if v != "tcp" && v != "udp" {
			return redirect.Match{}, fmt.Errorf("unsupported protocol")
		}
		return redirect.Match{Kind: redirect.MatchProtocol, Proto: redirect.Protocol(v)}, nil
	case "-i", "--in-interface":
		return redirect.Match{Kind: redirect.MatchInIface, Iface: v}, nil
	case "-o", "--out-interface":
		return redirect.Match{Kind: redirect.MatchOutIface, Iface: v}, nil
	case "-s", "--source", "-d", "--destination":
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return redirect.Match{}, fmt.Errorf("bad address")
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		kind := redirect.MatchDest
		if opt == "-s" || opt == "--source" {
			kind = redirect.MatchSource
		}
		return redirect.Match{Kind: kind, Prefix: p}, nil
	case "--dport", "--destination-port", "--dports":
		ports, err := parsePorts(v)
		return redirect.Match{Kind: redirect.MatchDestPort, Ports: ports}, err
	case "--sport", "--source-port", "--sports":
		ports, err := parsePorts(v)
		return redirect.Match{Kind: redirect.MatchSourcePort, Ports: ports}, err
	case "--uid-owner":
		return redirect.Match{Kind: redirect.MatchUIDOwner, Owner: v}, nil
	case "--gid-owner":
		return redirect.Match{Kind: redirect.MatchGIDOwner, Owner: v}, nil
	case "--mark":
		m, err := parseMark(v)
		kind := redirect.MatchMark
		if len(prev) > 0 && prev[len(prev)-1].Kind == markerConnMark {
			kind = redirect.MatchConnMark
		}
		return redirect.Match{Kind: kind, Mark: m}, err
	case "--ctstate":
		var states []redirect.CTState
		for _, s := range strings.Split(v, ",") {
			switch redirect.CTState(s) {
			case redirect.CTInvalid, redirect.CTRelated, redirect.CTEstablished:
				states = append(states, redirect.CTState(s))
			default:
				return redirect.Match{}, fmt.Errorf("unsupported conntrack state %q", s)
			}
		}
		return redirect.Match{Kind: redirect.MatchCTState, CTStates: states}, nil
	}
	return redirect.Match{}, fmt.Errorf("unsupported option")
}

// parseTarget reads a target and its options; it returns how many arguments it used.
func parseTarget(name string, rest []string) (redirect.Target, int, error) {
	t := redirect.Target{}
	used := 0
	opts := map[string]string{}
	flags := map[string]bool{}
	for used < len(rest) && strings.HasPrefix(rest[used], "--") {
		switch rest[used] {
		case "--save-mark", "--restore-mark":
			flags[rest[used]] = true
			used++
			continue
		}
		if used+1 >= len(rest) {
			return t, used, fmt.Errorf("option %s without a value", rest[used])
		}
		opts[rest[used]] = rest[used+1]
		used += 2
	}
	port := func(keys ...string) (uint16, error) {
		for _, k := range keys {
			if v, ok := opts[k]; ok {
				delete(opts, k)
				ps, err := parsePorts(v)
				if err != nil || len(ps) != 1 {
					return 0, fmt.Errorf("bad port %q", v)
				}
				return ps[0], nil
			}
		}
		return 0, fmt.Errorf("missing port")
	}
	var err error
	switch name {
	case "RETURN":
		t.Kind = redirect.TargetReturn
	case "ACCEPT":
		t.Kind = redirect.TargetAccept
	case "DROP":
		t.Kind = redirect.TargetDrop
	case "REDIRECT":
		t.Kind = redirect.TargetRedirect
		t.Port, err = port("--to-ports", "--to-port")
	case "TPROXY":
		t.Kind = redirect.TargetTProxy
		t.Port, err = port("--on-port")
		if err == nil {
			t.Mark, err = parseMark(opts["--tproxy-mark"])
			delete(opts, "--tproxy-mark")
		}
		if ip, ok := opts["--on-ip"]; ok && (ip == "0.0.0.0" || ip == "::") {
			delete(opts, "--on-ip")
		}
	case "MARK":
		t.Kind = redirect.TargetSetMark
		v, ok := opts["--set-mark"]
		if !ok {
			v, ok = opts["--set-xmark"]
		}
		delete(opts, "--set-mark")
		delete(opts, "--set-xmark")
		if !ok {
			return t, used, fmt.Errorf("MARK without --set-mark")
		}
		t.Mark, err = parseMark(v)
	case "CONNMARK":
		switch {
		case flags["--save-mark"]:
			t.Kind = redirect.TargetSaveMark
		case flags["--restore-mark"]:
			t.Kind = redirect.TargetRestoreMark
		default:
			return t, used, fmt.Errorf("CONNMARK without --save-mark or --restore-mark")
		}
		for _, k := range []string{"--nfmask", "--ctmask", "--mask"} {
			if v, ok := opts[k]; ok {
				if v != "0xffffffff" {
					return t, used, fmt.Errorf("unsupported %s %s", k, v)
				}
				delete(opts, k)
			}
		}
	case "CT":
		t.Kind = redirect.TargetCTZone
		v := opts["--zone"]
		delete(opts, "--zone")
		z, zerr := strconv.ParseUint(v, 10, 16)
		if zerr != nil {
			return t, used, fmt.Errorf("bad zone %q", v)
		}
		t.Zone = uint16(z)
	default:
		if !isChainName(name) {
			return t, used, fmt.Errorf("unsupported target")
		}
		t = redirect.Target{Kind: redirect.TargetJump, Chain: name}
	}
	if err != nil {
		return t, used, err
	}
	for k := range opts {
		return t, used, fmt.Errorf("unsupported option %s", k)
	}
	return t, used, nil
}

func isChainName(name string) bool {
	switch name {
	case "LOG", "SNAT", "DNAT", "MASQUERADE", "REJECT", "NFLOG", "NOTRACK", "TRACE", "AUDIT":
		return false
	}
	return name != ""
}

// Dump is iptables-save output parsed per table.
type Dump struct {
	Tables map[redirect.Table]*DumpTable
}

// DumpTable is one table of a dump: its chains (built-in and user), and every rule
// line in order with the chain it belongs to.
type DumpTable struct {
	Chains []string
	Lines  []DumpLine
}

// DumpLine is one "-A" line of iptables-save.
type DumpLine struct {
	Chain string
	Args  []string
	// Pos is the rule's place in its chain, 1 for the first.
	Pos int
}

// ParseSave parses iptables-save output. It only splits lines; rules are parsed on
// demand with ParseRuleArgs, since other software's rules may use anything.
func ParseSave(text string) (*Dump, error) {
	d := &Dump{Tables: map[redirect.Table]*DumpTable{}}
	var cur *DumpTable
	var rules map[string]int // per chain of cur, the rules seen so far
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			name := redirect.Table(strings.TrimSpace(l[1:]))
			cur, rules = &DumpTable{}, map[string]int{}
			d.Tables[name] = cur
		case l == "COMMIT":
			cur = nil
		case strings.HasPrefix(l, ":"):
			if cur == nil {
				return nil, fmt.Errorf("line %d: chain outside a table", line)
			}
			cur.Chains = append(cur.Chains, strings.Fields(l[1:])[0])
		case strings.HasPrefix(l, "-A "):
			if cur == nil {
				return nil, fmt.Errorf("line %d: rule outside a table", line)
			}
			f, err := splitQuoted(l)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			if len(f) < 2 {
				return nil, fmt.Errorf("line %d: rule without a chain", line)
			}
			rules[f[1]]++
			cur.Lines = append(cur.Lines, DumpLine{Chain: f[1], Args: f[2:], Pos: rules[f[1]]})
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", line, l)
		}
	}
	return d, sc.Err()
}

// splitQuoted splits an iptables-save line into words, honouring double quotes
// (comments are printed quoted).
func splitQuoted(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, has := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
			has = true
		case c == ' ' && !inQuote:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(c)
			has = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if has {
		out = append(out, cur.String())
	}
	return out, nil
}
