package nftables

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/redirect"

	"github.com/istio-cni/istio-cni/test/harness/golden"
)

// TestRenderMatchesGolden pins the rendered script of every case to
// testdata/<case>.nft. Run with -update after an intended change and review the diff.
func TestRenderMatchesGolden(t *testing.T) {
	for _, c := range specCases {
		t.Run(c.name, func(t *testing.T) {
			rs, err := translate(c.plan(t), testGroups)
			if err != nil {
				t.Fatal(err)
			}
			got := rs.text()
			golden.Check(t, filepath.Join("testdata", c.name+".nft"), []byte(got))
		})
	}
}

// TestRenderResolvesGroupNames proves named groups become gids through the system
// group database, numeric groups pass through, and an unknown name fails naming it.
func TestRenderResolvesGroupNames(t *testing.T) {
	build := func(groups ...string) *redirect.Plan {
		s := sidecarSpec()
		s.OwnerGroups = redirect.GroupFilter{Except: true, Groups: groups}
		p, err := redirect.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// root is gid 0 on every Linux system.
	text, err := Render(build("root", "4242"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"meta skgid 0 return", "meta skgid 4242 return"} {
		if !strings.Contains(text, want) {
			t.Errorf("render lacks %q:\n%s", want, text)
		}
	}
	_, err = Render(build("no-such-group-xyz"))
	if err == nil || !strings.Contains(err.Error(), `"no-such-group-xyz"`) {
		t.Errorf("unknown group: got error %v, want one naming the group", err)
	}
}

// TestTranslateEveryKind renders a hand-made plan that uses every match and target
// kind, both polarities, so no kind reaches the kernel untested.
func TestTranslateEveryKind(t *testing.T) {
	m := func(k redirect.MatchKind, neg bool, f func(*redirect.Match)) redirect.Match {
		x := redirect.Match{Kind: k, Negate: neg}
		if f != nil {
			f(&x)
		}
		return x
	}
	tcp := m(redirect.MatchProtocol, false, func(x *redirect.Match) { x.Proto = redirect.TCP })
	rules := []struct {
		rule redirect.Rule
		want string
	}{
		{redirect.Rule{Matches: []redirect.Match{tcp}, Target: redirect.Target{Kind: redirect.TargetAccept}}, "meta l4proto tcp accept"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchProtocol, true, func(x *redirect.Match) { x.Proto = redirect.UDP })}, Target: redirect.Target{Kind: redirect.TargetDrop}}, "meta l4proto != udp drop"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchInIface, true, func(x *redirect.Match) { x.Iface = "eth0" }), m(redirect.MatchOutIface, false, func(x *redirect.Match) { x.Iface = "lo" })}, Target: redirect.Target{Kind: redirect.TargetReturn}}, `iifname != "eth0" oifname "lo" return`},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchSource, false, func(x *redirect.Match) { x.Prefix = netip.MustParsePrefix("10.1.2.3/8") }), m(redirect.MatchDest, true, func(x *redirect.Match) { x.Prefix = netip.MustParsePrefix("1.2.3.4/32") })}, Target: redirect.Target{Kind: redirect.TargetReturn}}, "ip saddr 10.0.0.0/8 ip daddr != 1.2.3.4 return"},
		{redirect.Rule{Matches: []redirect.Match{tcp, m(redirect.MatchDestPort, true, func(x *redirect.Match) { x.Ports = []uint16{15008, 53, 53} }), m(redirect.MatchSourcePort, false, func(x *redirect.Match) { x.Ports = []uint16{7} })}, Target: redirect.Target{Kind: redirect.TargetRedirect, Port: 15001}}, "tcp dport != { 53, 15008 } tcp sport 7 redirect to :15001"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchUIDOwner, true, func(x *redirect.Match) { x.Owner = "1337" }), m(redirect.MatchGIDOwner, false, func(x *redirect.Match) { x.Owner = "java" })}, Target: redirect.Target{Kind: redirect.TargetReturn}}, "meta skuid != 1337 meta skgid 1001 return"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchMark, true, func(x *redirect.Match) { x.Mark = 1338 }), m(redirect.MatchConnMark, false, func(x *redirect.Match) { x.Mark = 1337 })}, Target: redirect.Target{Kind: redirect.TargetSetMark, Mark: 1337}}, "meta mark != 0x0000053a ct mark 0x00000539 meta mark set 0x00000539"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchCTState, false, func(x *redirect.Match) {
			x.CTStates = []redirect.CTState{redirect.CTRelated, redirect.CTEstablished}
		})}, Target: redirect.Target{Kind: redirect.TargetSaveMark}}, "ct state established,related ct mark set meta mark"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchCTState, true, func(x *redirect.Match) {
			x.CTStates = []redirect.CTState{redirect.CTRelated, redirect.CTInvalid}
		})}, Target: redirect.Target{Kind: redirect.TargetRestoreMark}}, "ct state != { invalid, related } meta mark set ct mark"},
		{redirect.Rule{Matches: []redirect.Match{m(redirect.MatchDest, true, func(x *redirect.Match) { x.Prefix = netip.MustParsePrefix("127.0.0.1/32") }), tcp}, Target: redirect.Target{Kind: redirect.TargetTProxy, Port: 15006, Mark: 1337}}, "ip daddr != 127.0.0.1 meta l4proto tcp tproxy to :15006 meta mark set 0x00000539 accept"},
		{redirect.Rule{Target: redirect.Target{Kind: redirect.TargetCTZone, Zone: 2}}, "ct zone set 2"},
		{redirect.Rule{Target: redirect.Target{Kind: redirect.TargetJump, Chain: "ISTIO_X"}}, "jump ISTIO_X"},
	}
	for _, r := range rules {
		nr, err := translateRule(redirect.IPv4, r.rule, testGroups)
		if err != nil {
			t.Errorf("%s: %v", r.want, err)
			continue
		}
		if got := nr.text(redirect.IPv4); got != r.want {
			t.Errorf("rendered %q, want %q", got, r.want)
		}
	}
}
