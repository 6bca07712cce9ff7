package redirect_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// TestCutOffNamesOnlyACaptureCutOffOrEmptied: a whole capture, whichever
// settings or plugin version wrote it (a chain nothing jumps to that holds only
// its own rules is one: ISTIO_INBOUND without inbound ports, ISTIO_REDIRECT
// without outbound capture), is not cut; a chain that sends packets on but is no
// longer reached, or that is reached but emptied, is.
func TestCutOffNamesOnlyACaptureCutOffOrEmptied(t *testing.T) {
	const nat = "ipv4: table nat"
	hook := func(name string, to ...string) redirect.LiveChain {
		return redirect.LiveChain{Table: nat, Name: name, Hook: true, Rules: len(to), Jumps: to}
	}
	chain := func(name string, rules int, to ...string) redirect.LiveChain {
		return redirect.LiveChain{Table: nat, Name: name, Rules: rules, Jumps: to}
	}
	whole := func() []redirect.LiveChain {
		return []redirect.LiveChain{
			hook("PREROUTING", "ISTIO_INBOUND"), hook("OUTPUT", "ISTIO_OUTPUT"),
			chain("ISTIO_INBOUND", 5, "ISTIO_IN_REDIRECT"), chain("ISTIO_REDIRECT", 1), chain("ISTIO_IN_REDIRECT", 1),
			chain("ISTIO_OUTPUT", 10, "ISTIO_IN_REDIRECT", "ISTIO_IN_REDIRECT", "ISTIO_REDIRECT"),
		}
	}
	for _, tc := range []struct {
		name   string
		chains []redirect.LiveChain
		want   []string
	}{
		{"nothing of ours", nil, nil},
		{"a whole capture", whole(), nil},
		{"no inbound capture: ISTIO_INBOUND holds its RETURN, unreached", []redirect.LiveChain{
			hook("OUTPUT", "ISTIO_OUTPUT"), chain("ISTIO_INBOUND", 1), chain("ISTIO_REDIRECT", 1), chain("ISTIO_IN_REDIRECT", 1),
			chain("ISTIO_OUTPUT", 10, "ISTIO_IN_REDIRECT", "ISTIO_REDIRECT"),
		}, nil},
		{"the output hook's jump deleted", append(whole()[:1], whole()[2:]...),
			[]string{"ipv4: table nat: chain ISTIO_OUTPUT sends packets on to others of ours, but no rule jumps to it"}},
		{"an nftables base chain flushed", append([]redirect.LiveChain{hook("prerouting", "ISTIO_INBOUND"), hook("output")}, whole()[2:]...),
			[]string{"ipv4: table nat: chain ISTIO_OUTPUT sends packets on to others of ours, but no rule jumps to it"}},
		{"a chain flushed", append(whole()[:3], chain("ISTIO_REDIRECT", 0), chain("ISTIO_IN_REDIRECT", 1), whole()[5]),
			[]string{"ipv4: table nat: chain ISTIO_REDIRECT holds no rules, but rules jump to it"}},
		{"a jump in another table does not reach it", []redirect.LiveChain{
			{Table: "ipv4: table mangle", Name: "PREROUTING", Hook: true, Rules: 1, Jumps: []string{"ISTIO_INBOUND"}},
			chain("ISTIO_INBOUND", 1, "ISTIO_IN_REDIRECT"), chain("ISTIO_IN_REDIRECT", 1),
		}, []string{"ipv4: table nat: chain ISTIO_INBOUND sends packets on to others of ours, but no rule jumps to it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, redirect.CutOff(tc.chains)); diff != "" {
				t.Errorf("CutOff (-want +got):\n%s", diff)
			}
		})
	}
}
