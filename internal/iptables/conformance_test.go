package iptables

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// referenceDir is where Istio's expected capture rules live. They are Istio's data
// and are never copied into this repository.
func referenceDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ISTIO_REFERENCE_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "reference", "istio-iptables-capture")
	}
	if _, err := os.Stat(filepath.Join(dir, "cases.json")); err != nil {
		t.Skipf("Istio's reference capture rules are not here (%s): conformance NOT checked. "+
			"Set ISTIO_REFERENCE_DIR or place shared/ beside the repository.", dir)
	}
	return dir
}

type referenceCases struct {
	Base  map[string]any            `json:"_base_config"`
	Cases map[string]map[string]any `json:"cases"`
}

// ReferenceCase is one of Istio's capture test inputs.
type referenceCase struct {
	Name    string
	Options specs.Settings
	Golden  string
}

func loadReference(t *testing.T) []referenceCase {
	t.Helper()
	dir := referenceDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rc referenceCases
	if err := json.Unmarshal(raw, &rc); err != nil {
		t.Fatalf("cases.json: %v", err)
	}
	var out []referenceCase
	for name, overrides := range rc.Cases {
		if only, ok := overrides["_only"]; ok && only != "iptables" {
			continue
		}
		merged := map[string]any{}
		for k, v := range rc.Base {
			merged[k] = v
		}
		for k, v := range overrides {
			merged[k] = v
		}
		opts, err := optionsFromIstio(merged)
		if err != nil {
			t.Fatalf("case %s: %v", name, err)
		}
		golden, err := os.ReadFile(filepath.Join(dir, name+".golden"))
		if err != nil {
			t.Fatalf("case %s: %v", name, err)
		}
		out = append(out, referenceCase{Name: name, Options: opts, Golden: string(golden)})
	}
	slices.SortFunc(out, func(a, b referenceCase) int { return strings.Compare(a.Name, b.Name) })
	if len(out) < 27 {
		t.Fatalf("only %d reference cases found, want 27", len(out))
	}
	return out
}

// optionsFromIstio maps Istio's test configuration fields onto our capture settings.
func optionsFromIstio(m map[string]any) (specs.Settings, error) {
	out := specs.Settings{}
	for key, field := range map[string]redirect.Field{
		"ProxyPort": redirect.FieldProxyPort, "InboundCapturePort": redirect.FieldInboundCapturePort,
		"InboundTunnelPort": redirect.FieldInboundTunnelPort, "ProxyUID": redirect.FieldProxyUIDs,
		"ProxyGID": redirect.FieldProxyGIDs, "InboundInterceptionMode": redirect.FieldMode,
		"InboundTProxyMark": redirect.FieldTProxyMark, "InboundTProxyRouteTable": redirect.FieldTProxyRouteTable,
		"InboundPortsInclude": redirect.FieldInboundPorts, "InboundPortsExclude": redirect.FieldInboundPortsExclude,
		"OutboundIPRangesInclude": redirect.FieldOutboundCIDRs, "OutboundIPRangesExclude": redirect.FieldOutboundCIDRsExclude,
		"OutboundPortsInclude": redirect.FieldOutboundPorts, "OutboundPortsExclude": redirect.FieldOutboundPortsExclude,
		"RerouteVirtualInterfaces": redirect.FieldRerouteVirtualInterfaces, "ExcludeInterfaces": redirect.FieldExcludeInterfaces,
		"OwnerGroupsInclude": redirect.FieldOwnerGroupsInclude, "OwnerGroupsExclude": redirect.FieldOwnerGroupsExclude,
		"HostIPv4LoopbackCidr": redirect.FieldHostIPv4Loopback, "RedirectDNS": redirect.FieldRedirectDNS,
		"CaptureAllDNS": redirect.FieldCaptureAllDNS, "DropInvalid": redirect.FieldDropInvalid, "EnableIPv6": redirect.FieldIPv6,
	} {
		switch v := m[key].(type) {
		case string:
			out[field] = v
		case bool:
			out[field] = strconv.FormatBool(v)
		case nil:
		default:
			return nil, fmt.Errorf("%s: %v is not a string or boolean", key, v)
		}
	}
	var dns []string
	for _, key := range []string{"DNSServersV4", "DNSServersV6"} {
		if vs, ok := m[key].([]any); ok {
			for _, v := range vs {
				dns = append(dns, fmt.Sprint(v))
			}
		}
	}
	if len(dns) > 0 {
		out[redirect.FieldDNSServers] = strings.Join(dns, ",")
	}
	return out, nil
}

// goldenRestores extracts the iptables-restore inputs from an Istio golden file: one
// per family, IPv4 first. A table that does not come after the previous one in
// filter/mangle/nat/raw order starts the next family's restore.
func goldenRestores(golden string) []string {
	var restores []string
	var cur strings.Builder
	last := -1
	for _, line := range strings.Split(golden, "\n") {
		if strings.HasPrefix(line, "* ") {
			idx := slices.Index(redirect.TableOrder, redirect.Table(strings.TrimPrefix(line, "* ")))
			if idx <= last && cur.Len() > 0 {
				restores = append(restores, cur.String())
				cur.Reset()
			}
			last = idx
		}
		if strings.HasPrefix(line, "* ") || strings.HasPrefix(line, "-") || line == "COMMIT" {
			cur.WriteString(line + "\n")
		}
	}
	if cur.Len() > 0 {
		restores = append(restores, cur.String())
	}
	return restores
}

// parsedTable is a restore's table replayed to its final state.
type parsedTable struct {
	Chains []string
	Final  map[string][]redirect.Rule
}

// parseRestoreText reads Istio-style restore text ("-N", "-A", "-I CHAIN N") and
// replays it into each chain's final rules.
func parseRestoreText(t *testing.T, text string) map[redirect.Table]parsedTable {
	t.Helper()
	out := map[redirect.Table]parsedTable{}
	var table redirect.Table
	var chains []string
	var ops []redirect.Rule
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "* "):
			table, chains, ops = redirect.Table(f[1]), nil, nil
		case line == "COMMIT":
			final, err := redirect.Replay(ops)
			if err != nil {
				t.Fatalf("replay %s: %v", table, err)
			}
			out[table] = parsedTable{Chains: chains, Final: final}
		case f[0] == "-N":
			chains = append(chains, f[1])
		case f[0] == "-A":
			r, err := ParseRuleArgs(f[1], f[2:])
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			ops = append(ops, r)
		case f[0] == "-I":
			var pos int
			fmt.Sscan(f[2], &pos)
			r, err := ParseRuleArgs(f[1], f[3:])
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			r.Position = pos
			ops = append(ops, r)
		default:
			t.Fatalf("unexpected restore line %q", line)
		}
	}
	return out
}

// TestConformsToIstioReference proves that for each of Istio's 27 reference inputs our
// plan programs the same rules in effect: the same chains per family and table, and
// after replaying every append and insert, the same rules in the same order in every
// chain (matches compared as typed values, so "--to-port" and "--to-ports" agree).
// It also reports how many restore lines are textually identical to Istio's.
func TestConformsToIstioReference(t *testing.T) {
	identical, total := 0, 0
	for _, tc := range loadReference(t) {
		t.Run(tc.Name, func(t *testing.T) {
			plan := tc.Options.Plan(t)
			want := goldenRestores(tc.Golden)
			if len(want) != len(plan.Families) {
				t.Fatalf("Istio restores %d families, plan has %d", len(want), len(plan.Families))
			}
			for i, fp := range plan.Families {
				got := RenderPlanText(&fp)
				gotTables := parseRestoreText(t, got)
				wantTables := parseRestoreText(t, want[i])
				if diff := cmp.Diff(wantTables, gotTables, cmp.Comparer(prefixEqual)); diff != "" {
					t.Errorf("%s: rules differ from Istio's in effect (-istio +ours):\n%s\nours:\n%s", fp.Family, diff, got)
				}
				wl, gl := strings.Split(want[i], "\n"), strings.Split(got, "\n")
				total += len(wl)
				if len(wl) != len(gl) {
					t.Errorf("%s: %d restore lines, Istio has %d", fp.Family, len(gl), len(wl))
				}
				for j := range wl {
					switch {
					case j >= len(gl):
					case gl[j] == wl[j]:
						identical++
					case !sameRuleLine(t, wl[j], gl[j]):
						// Lines may differ in spelling only ("--to-port" for
						// "--to-ports", "::7f00:35" for "::127.0.0.53").
						t.Errorf("%s line %d differs in text:\nistio: %s\nours:  %s", fp.Family, j+1, wl[j], gl[j])
					}
				}
			}
		})
	}
	t.Logf("restore lines identical to Istio's text: %d of %d", identical, total)
}

// prefixEqual compares address matches as the kernel sees them (iptables masks them).
func prefixEqual(a, b redirect.Match) bool {
	if a.Kind != b.Kind || a.Negate != b.Negate || a.Proto != b.Proto || a.Iface != b.Iface ||
		a.Owner != b.Owner || a.Mark != b.Mark || !slices.Equal(a.Ports, b.Ports) || !slices.Equal(a.CTStates, b.CTStates) {
		return false
	}
	return a.Prefix.Masked() == b.Prefix.Masked()
}

// sameRuleLine reports whether two restore lines are the same operation on the same
// typed rule.
func sameRuleLine(t *testing.T, a, b string) bool {
	t.Helper()
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) < 3 || len(fb) < 3 || fa[0] != fb[0] || fa[1] != fb[1] || fa[0] != "-A" {
		return false
	}
	ra, erra := ParseRuleArgs(fa[1], fa[2:])
	rb, errb := ParseRuleArgs(fb[1], fb[2:])
	return erra == nil && errb == nil && cmp.Equal(ra, rb, cmp.Comparer(prefixEqual))
}
