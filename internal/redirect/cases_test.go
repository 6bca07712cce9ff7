package redirect_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/istio-cni/istio-cni/test/harness/golden"

	. "github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// Istio's sidecar injector excludes the agent's and Envoy's own inbound ports.
const sidecarInboundExclude = "15090,15021,15020"

// specCases are the named captures that the tracer tests and the golden plans share.
// Options are Istio's strings, so every case also goes through the parsers.
var specCases = []struct {
	name string
	opts specs.Settings
}{
	{"empty", specs.Settings{}},
	{"sidecar", specs.Settings{FieldInboundPorts: "*", FieldInboundPortsExclude: sidecarInboundExclude, FieldOutboundCIDRs: "*"}},
	{"sidecar-ipv6", specs.Settings{FieldInboundPorts: "*", FieldInboundPortsExclude: sidecarInboundExclude, FieldOutboundCIDRs: "*", FieldIPv6: "true"}},
	{"custom-ports", specs.Settings{FieldProxyPort: "15101", FieldInboundCapturePort: "15106", FieldInboundTunnelPort: "15108", FieldInboundPorts: "*", FieldOutboundCIDRs: "*"}},
	{"inbound-ports", specs.Settings{FieldInboundPorts: "8080, 9090,"}},
	{"outbound-cidr-include", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "10.96.0.1/12"}},
	{"outbound-exclude", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldOutboundCIDRsExclude: "10.0.0.0/24,169.254.169.254", FieldOutboundPortsExclude: "6379"}},
	{"outbound-ports-include", specs.Settings{FieldOutboundPorts: "3306,5432"}},
	{"exclude-interface", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldExcludeInterfaces: "net1"}},
	{"kubevirt", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldRerouteVirtualInterfaces: "eth1"}},
	{"kubevirt-cidr", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "10.0.0.0/8", FieldRerouteVirtualInterfaces: "eth1"}},
	{"dns", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldRedirectDNS: "true", FieldDNSServers: "10.96.0.10"}},
	{"dns-capture-all", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldRedirectDNS: "true", FieldCaptureAllDNS: "true"}},
	{"dns-ipv6", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldRedirectDNS: "true", FieldDNSServers: "10.96.0.10,fd00:10:96::a", FieldIPv6: "true"}},
	{"dns-no-servers", specs.Settings{FieldOutboundCIDRs: "*", FieldRedirectDNS: "true"}},
	{"owner-groups-include", specs.Settings{FieldOutboundCIDRs: "*", FieldOwnerGroupsInclude: "java,202"}},
	{"owner-groups-exclude", specs.Settings{FieldOutboundCIDRs: "*", FieldOwnerGroupsExclude: "888,ftp"}},
	{"owner-groups-include-empty", specs.Settings{FieldOutboundCIDRs: "*", FieldOwnerGroupsInclude: ""}},
	{"multi-uid", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldProxyUIDs: "3,4", FieldProxyGIDs: "1,2", FieldRedirectDNS: "true", FieldDNSServers: "10.96.0.10"}},
	{"loopback-include", specs.Settings{FieldOutboundCIDRs: "127.1.2.3/32"}},
	{"host-loopback-cidr", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldHostIPv4Loopback: "127.0.0.1/8"}},
	{"tproxy", specs.Settings{FieldMode: "TPROXY", FieldInboundPorts: "*", FieldInboundPortsExclude: sidecarInboundExclude, FieldOutboundCIDRs: "*"}},
	{"tproxy-ports", specs.Settings{FieldMode: "TPROXY", FieldInboundPorts: "8080"}},
	{"tproxy-no-inbound-ports", specs.Settings{FieldMode: "TPROXY", FieldOutboundCIDRs: "*", FieldExcludeInterfaces: "net1"}},
	{"tproxy-ipv6", specs.Settings{FieldMode: "TPROXY", FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldIPv6: "true", FieldExcludeInterfaces: "net1"}},
	{"tproxy-kubevirt", specs.Settings{FieldMode: "TPROXY", FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldRerouteVirtualInterfaces: "eth1"}},
	{"drop-invalid", specs.Settings{FieldInboundPorts: "*", FieldOutboundCIDRs: "*", FieldDropInvalid: "true"}},
}

var (
	casePlansOnce sync.Once
	casePlans     map[string]*Plan
	casePlansErr  error
)

// casePlan returns the plan of a named case, built once.
func casePlan(t *testing.T, name string) *Plan {
	t.Helper()
	casePlansOnce.Do(func() {
		casePlans = map[string]*Plan{}
		for _, c := range specCases {
			spec, err := c.opts.Spec()
			if err != nil {
				casePlansErr = err
				return
			}
			p, err := Build(spec)
			if err != nil {
				casePlansErr = err
				return
			}
			casePlans[c.name] = p
		}
	})
	if casePlansErr != nil {
		t.Fatalf("building the spec cases: %v", casePlansErr)
	}
	p, ok := casePlans[name]
	if !ok {
		t.Fatalf("no spec case named %q", name)
	}
	return p
}

// TestGoldenPlans pins every case's plan as JSON. Run with -update after an intended
// change to the builder, and review the diff.
func TestGoldenPlans(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range specCases {
		t.Run(c.name, func(t *testing.T) {
			if seen[c.name] {
				t.Fatalf("case name %q used twice", c.name)
			}
			seen[c.name] = true
			p := casePlan(t, c.name)
			if err := p.Check(); err != nil {
				t.Fatalf("plan breaks an invariant: %v", err)
			}
			got, err := json.MarshalIndent(p, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", "plans", c.name+".json")
			golden.Check(t, path, got)
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// The golden file must decode back to the same plan: it is data, not text.
			var decoded Plan
			if err := json.Unmarshal(want, &decoded); err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if diff := cmp.Diff(p, &decoded, cmpPlan); diff != "" {
				t.Errorf("%s does not decode to the plan (-built +decoded):\n%s", path, diff)
			}
		})
	}
}

// TestGoldenPlansHaveNoStrays keeps testdata/plans in step with specCases.
func TestGoldenPlansHaveNoStrays(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "plans", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range specCases {
		names[c.name+".json"] = true
	}
	for _, f := range files {
		if !names[filepath.Base(f)] {
			t.Errorf("%s belongs to no spec case: delete it", f)
		}
	}
}

// cmpPlan compares plans by value, treating nil and empty slices alike.
var cmpPlan = cmp.Options{
	cmpopts.EquateEmpty(),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
}
