package nftables

import (
	"fmt"
	"slices"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// encodedRule is one rule of a ruleset as ruleExprs encodes it, with the anonymous
// sets it looks up.
type encodedRule struct {
	where  string
	family redirect.Family
	rule   rule
	exprs  []any
	sets   map[string]liveSet
}

func encodeAll(t *testing.T, rs *ruleset) []encodedRule {
	t.Helper()
	var out []encodedRule
	for _, tb := range rs.tables {
		for _, c := range tb.chains {
			for i, r := range c.rules {
				sets := map[string]liveSet{}
				addSet := func(_ gnft.SetDatatype, elems [][]byte) (*gnft.Set, error) {
					name := fmt.Sprintf("__set%d", len(sets))
					sets[name] = liveSet{anonymous: true, constant: true, keys: elems}
					return &gnft.Set{Name: name, Anonymous: true, Constant: true}, nil
				}
				ex, err := ruleExprs(tb.family, &r, addSet)
				if err != nil {
					t.Fatal(err)
				}
				var exprs []any
				for _, e := range ex {
					exprs = append(exprs, e)
				}
				out = append(out, encodedRule{
					where:  fmt.Sprintf("%s chain %s rule %d %q", tb.id(), c.name, i+1, r.text(tb.family)),
					family: tb.family, rule: r, exprs: exprs, sets: sets,
				})
			}
		}
	}
	return out
}

func allRulesets(t *testing.T) map[string]*ruleset {
	t.Helper()
	out := map[string]*ruleset{}
	for _, c := range specCases {
		rs, err := translate(c.plan(t), testGroups)
		if err != nil {
			t.Fatal(err)
		}
		out[c.name] = rs
	}
	rs, err := translate(everyKindPlan(), testGroups)
	if err != nil {
		t.Fatal(err)
	}
	out["every-kind"] = rs
	return out
}

// TestDecodeReadsBackEveryEncodedRule proves that every rule of every case (and of
// the plan using every kind) decodes from its expressions to the rule it was
// encoded from, and prints as the render does.
func TestDecodeReadsBackEveryEncodedRule(t *testing.T) {
	for name, rs := range allRulesets(t) {
		for _, e := range encodeAll(t, rs) {
			got, ok, text := decodeRule(e.family, e.exprs, e.sets)
			if !ok || !got.equal(&e.rule) {
				t.Errorf("%s: %s decoded as %q (ok=%v)", name, e.where, text, ok)
				continue
			}
			if want := e.rule.text(e.family); text != want {
				t.Errorf("%s: %s printed as %q", name, e.where, text)
			}
		}
	}
}

// TestDecodeNoticesEveryChangedExpression proves the comparison is by content: in
// every encoded rule, dropping any one expression or changing a value any one
// expression holds gives a rule that is not the encoded one. (A reader that loses
// an expression it does not know, as a library rule dump does with tproxy, fails
// this.)
func TestDecodeNoticesEveryChangedExpression(t *testing.T) {
	for name, rs := range allRulesets(t) {
		for _, e := range encodeAll(t, rs) {
			same := func(exprs []any, sets map[string]liveSet) bool {
				got, ok, _ := decodeRule(e.family, exprs, sets)
				return ok && got.equal(&e.rule)
			}
			for i := range e.exprs {
				dropped := slices.Delete(slices.Clone(e.exprs), i, i+1)
				if same(dropped, e.sets) {
					t.Errorf("%s: %s without expression %d %s decodes as the same rule", name, e.where, i, exprText(e.exprs[i]))
				}
				for _, changed := range mutations(e.exprs[i]) {
					exprs := slices.Clone(e.exprs)
					exprs[i] = changed
					if same(exprs, e.sets) {
						t.Errorf("%s: %s with expression %d changed to %s decodes as the same rule", name, e.where, i, exprText(changed))
					}
				}
			}
			for setName, s := range e.sets {
				other := map[string]liveSet{}
				for k, v := range e.sets {
					other[k] = v
				}
				s.keys = append(slices.Clone(s.keys[:len(s.keys)-1]), append([]byte{0xff}, s.keys[len(s.keys)-1][1:]...))
				other[setName] = s
				if same(e.exprs, other) {
					t.Errorf("%s: %s with an element of set %s changed decodes as the same rule", name, e.where, setName)
				}
			}
		}
	}
}

// mutations returns copies of e, each with one value changed.
func mutations(e any) []any {
	flip := func(b []byte) []byte {
		c := slices.Clone(b)
		c[len(c)-1] ^= 0x01
		return c
	}
	var out []any
	switch x := e.(type) {
	case *expr.Meta:
		m := *x
		m.Key = expr.MetaKeyPRIORITY
		out = append(out, &m)
		m = *x
		m.Register++
		out = append(out, &m)
	case *expr.Cmp:
		c := *x
		c.Data = flip(x.Data)
		out = append(out, &c)
		c = *x
		c.Op = expr.CmpOpGt
		out = append(out, &c)
		c = *x
		c.Register++
		out = append(out, &c)
	case *expr.Payload:
		p := *x
		p.Offset++
		out = append(out, &p)
		p = *x
		p.Base++
		out = append(out, &p)
	case *expr.Bitwise:
		b := *x
		b.Mask = slices.Clone(x.Mask)
		b.Mask[0] ^= 0x80
		out = append(out, &b)
		b = *x
		b.Xor = flip(x.Xor)
		out = append(out, &b)
	case *expr.Lookup:
		l := *x
		l.Invert = !l.Invert
		out = append(out, &l)
		l = *x
		l.SetName = "other"
		out = append(out, &l)
	case *expr.Immediate:
		i := *x
		i.Data = flip(x.Data)
		out = append(out, &i)
	case *expr.Verdict:
		v := *x
		v.Chain += "X"
		if v.Kind != expr.VerdictJump {
			v.Kind = expr.VerdictContinue
		}
		out = append(out, &v)
	case *expr.Ct:
		c := *x
		c.Key = expr.CtKeyDIRECTION
		out = append(out, &c)
		c = *x
		c.Direction = 1
		out = append(out, &c)
	case *expr.Redir:
		r := *x
		r.Flags |= 0x4 // random
		out = append(out, &r)
	case *expr.TProxy:
		p := *x
		p.RegAddr = 2
		out = append(out, &p)
		p = *x
		p.Family ^= unix.NFPROTO_IPV4 ^ unix.NFPROTO_IPV6 // the other IP family
		out = append(out, &p)
	}
	return out
}

// TestDecodeSkipsCountersAndNamesTheRest proves a counter (which the kernel keeps
// counting) is not part of a rule's content, and an expression this backend never
// writes leaves the rule undecoded but printed as far as it decodes.
func TestDecodeSkipsCountersAndNamesTheRest(t *testing.T) {
	r := rule{
		matches: []match{{kind: redirect.MatchDestPort, proto: redirect.TCP, ports: []uint16{9}}},
		target:  redirect.Target{Kind: redirect.TargetAccept},
	}
	ex, err := ruleExprs(redirect.IPv4, &r, nil)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []any
	for _, e := range ex {
		exprs = append(exprs, e)
	}
	withCounter := slices.Insert(slices.Clone(exprs), len(exprs)-1, any(&expr.Counter{Packets: 7, Bytes: 900}))
	if got, ok, text := decodeRule(redirect.IPv4, withCounter, nil); !ok || !got.equal(&r) || text != "tcp dport 9 accept" {
		t.Errorf("with a counter: decoded %q (ok=%v), want the rule without it", text, ok)
	}
	withLog := slices.Insert(slices.Clone(exprs), len(exprs)-1, any(opaqueExpr{name: "log"}))
	_, ok, text := decodeRule(redirect.IPv4, withLog, nil)
	if want := "tcp dport 9 [log] [accept]"; ok || text != want {
		t.Errorf("with a log statement: decoded %q (ok=%v), want %q", text, ok, want)
	}
}
