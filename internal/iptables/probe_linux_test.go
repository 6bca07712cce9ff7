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
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
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
		if got := rulestext.Saved(runIn(t, ns, "iptables-"+string(mode)+"-save")); strings.Contains(got, "ISTIO_") {
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

// TestCleanupInNftModeRunsNoProcess: where the ADD writes natively (nft mode, a
// known iptables-nft), DEL's cleanup removes our chains and hook rules in one
// netlink transaction per family that holds tables, running no iptables-save and
// no restore, and leaves the namespace exactly as before the apply: foreign rules
// in the built-in chains, a foreign chain and a foreign jump to it kept. In
// legacy mode it saves, and restores where something of ours is, as before.
func TestCleanupInNftModeRunsNoProcess(t *testing.T) {
	root.Require(t)
	eachModeAndCase(t, func(t *testing.T, mode Mode, tc backendCase, b *Backend) {
		if mode == ModeNFT && !b.nativeAllowed() {
			t.Fatalf("this machine's iptables-nft is older than %v: the native removal is not tested", nativeMinVersion)
		}
		plan := tc.opts.Plan(t)
		ns := newNS(t)
		for _, ipt := range []string{"iptables-" + string(mode), "ip6tables-" + string(mode)} {
			runIn(t, ns, ipt, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-j", "RETURN")
			runIn(t, ns, ipt, "-t", "nat", "-N", "FOREIGN")
			runIn(t, ns, ipt, "-t", "nat", "-A", "PREROUTING", "-p", "udp", "-j", "FOREIGN")
		}
		before4 := rulestext.Saved(runIn(t, ns, "iptables-"+string(mode)+"-save"))
		before6 := rulestext.Saved(runIn(t, ns, "ip6tables-"+string(mode)+"-save"))
		if _, err := capture.Apply(context.Background(), ns, b, plan); err != nil {
			t.Fatal(err)
		}
		rec := timing.Start()
		if _, err := capture.Cleanup(timing.With(context.Background(), rec), ns, b, plan); err != nil {
			t.Fatal(err)
		}
		var ran []string
		for _, p := range rec.Phases() {
			if strings.HasPrefix(p.Name, "iptables-") {
				ran = append(ran, p.Name)
			}
		}
		want := []string{"iptables-native-cleanup-ipv4", "iptables-native-cleanup-ipv6"}
		if mode == ModeLegacy {
			want = []string{"iptables-save-ipv4", "iptables-restore-ipv4", "iptables-save-ipv6"}
			if plan.Family(redirect.IPv6) != nil {
				want = append(want, "iptables-restore-ipv6") // else nothing of ours there to remove
			}
		}
		if diff := cmp.Diff(want, ran); diff != "" {
			t.Errorf("cleanup's steps (-want +got):\n%s", diff)
		}
		if got := rulestext.Saved(runIn(t, ns, "iptables-"+string(mode)+"-save")); got != before4 {
			t.Errorf("cleanup left IPv4 state different:\nbefore:\n%s\nafter:\n%s", before4, got)
		}
		if got := rulestext.Saved(runIn(t, ns, "ip6tables-"+string(mode)+"-save")); got != before6 {
			t.Errorf("cleanup left IPv6 state different:\nbefore:\n%s\nafter:\n%s", before6, got)
		}
	})
}
