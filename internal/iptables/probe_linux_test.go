package iptables

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// iptablesPhases runs capture.Apply with a timing recorder and returns the names of
// the iptables processes it ran, in order (the phases the backend marks).
func iptablesPhases(t *testing.T, ns string, b *Backend, plan *redirect.Plan) (changed bool, ran []string) {
	t.Helper()
	rec := timing.Start()
	changed, err := capture.Apply(timing.With(context.Background(), rec), ns, b, plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rec.Phases() {
		if strings.HasPrefix(p.Name, "iptables-save") || strings.HasPrefix(p.Name, "iptables-restore") || strings.HasPrefix(p.Name, "iptables-native") {
			ran = append(ran, p.Name)
		}
	}
	return changed, ran
}

// TestApplyInANewNamespaceRunsOnlyTheRestores: a pod's new namespace holds no
// table, so the ADD's apply runs one iptables-restore per planned family (in nft
// mode none for what it writes natively) and no iptables-save; once tables exist (a second apply, a foreign rule in the other
// family) it reads them first, as before, and stays idempotent and exact.
func TestApplyInANewNamespaceRunsOnlyTheRestores(t *testing.T) {
	root.Require(t)
	eachModeAndCase(t, func(t *testing.T, mode Mode, tc backendCase, b *Backend) {
		plan := tc.opts.Plan(t)
		ipv6 := plan.Family(redirect.IPv6) != nil
		ns := newNS(t)

		changed, ran := iptablesPhases(t, ns, b, plan)
		// One restore per planned family, or in nft mode none for a family whose
		// rules are written natively (native_linux.go).
		var want []string
		for _, fp := range plan.Families {
			l, err := layout(&fp)
			if err != nil {
				t.Fatal(err)
			}
			how := "restore"
			if _, err := translateNative(fp.Family, l); b.nativeAllowed() && err == nil {
				how = "native"
			}
			want = append(want, "iptables-"+how+"-"+fp.Family.String())
		}
		if diff := cmp.Diff(want, ran); !changed || diff != "" {
			t.Fatalf("first apply in a new namespace: changed=%v, processes (-want +got):\n%s", changed, diff)
		}
		if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
			t.Fatalf("verify after the first apply: %v %q", err, diffs)
		}

		// Tables exist now: the second apply reads them and changes nothing.
		changed, ran = iptablesPhases(t, ns, b, plan)
		want = []string{"iptables-save-ipv4"}
		if ipv6 {
			want = append(want, "iptables-save-ipv6")
		}
		if diff := cmp.Diff(want, ran); changed || diff != "" {
			t.Fatalf("second apply: changed=%v, processes (-want +got):\n%s", changed, diff)
		}

		// A table in the other family (here IPv6, with a foreign rule) is read too,
		// so stale rules of ours there could not survive.
		if !ipv6 {
			runIn(t, ns, "ip6tables-"+string(mode), "-t", "nat", "-N", "FOREIGN")
			_, ran = iptablesPhases(t, ns, b, plan)
			if !slices.Contains(ran, "iptables-save-ipv6") {
				t.Fatalf("apply with an IPv6 table present did not read it: %q", ran)
			}
		}
		if _, err := capture.Cleanup(context.Background(), ns, b, plan); err != nil {
			t.Fatal(err)
		}
		if got := stripComments(runIn(t, ns, "iptables-"+string(mode)+"-save")); strings.Contains(got, "ISTIO_") {
			t.Errorf("cleanup left rules of ours:\n%s", got)
		}
	})
}

// TestNftTableFamiliesReadsTheNamespacesTables: the netlink dump behind the probe
// sees ip and ip6 tables by family, and not tables of other families.
func TestNftTableFamiliesReadsTheNamespacesTables(t *testing.T) {
	root.Require(t)
	for _, tc := range []struct {
		name   string
		tables []string // nft add table ARGS
		v4, v6 bool
	}{
		{"none", nil, false, false},
		{"ip", []string{"ip x"}, true, false},
		{"ip6", []string{"ip6 x"}, false, true},
		{"both", []string{"ip x", "ip6 y"}, true, true},
		{"inet-only", []string{"inet x"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNS(t)
			for _, tbl := range tc.tables {
				runIn(t, ns, "nft", append([]string{"add", "table"}, strings.Fields(tbl)...)...)
			}
			var v4, v6 bool
			if err := netns.Do(ns, func() (err error) { v4, v6, err = nftTableFamilies(); return err }); err != nil {
				t.Fatal(err)
			}
			if v4 != tc.v4 || v6 != tc.v6 {
				t.Errorf("ip tables %v, ip6 tables %v; want %v, %v", v4, v6, tc.v4, tc.v6)
			}
		})
	}
}
