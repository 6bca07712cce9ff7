package redirect

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
)

// Istio's sidecar injector excludes the agent's and Envoy's own inbound ports.
const sidecarInboundExclude = "15090,15021,15020"

// specCases are the named captures that the tracer tests and the golden plans share.
// Options are Istio's strings, so every case also goes through the parsers.
var specCases = []struct {
	name string
	opts Options
}{
	{"empty", Options{}},
	{"sidecar", Options{InboundPortsInclude: "*", InboundPortsExclude: sidecarInboundExclude, OutboundIPRangesInclude: "*"}},
	{"sidecar-ipv6", Options{InboundPortsInclude: "*", InboundPortsExclude: sidecarInboundExclude, OutboundIPRangesInclude: "*", EnableIPv6: true}},
	{"custom-ports", Options{ProxyPort: "15101", InboundCapturePort: "15106", InboundTunnelPort: "15108", InboundPortsInclude: "*", OutboundIPRangesInclude: "*"}},
	{"inbound-ports", Options{InboundPortsInclude: "8080, 9090,"}},
	{"outbound-cidr-include", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "10.96.0.1/12"}},
	{"outbound-exclude", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", OutboundIPRangesExclude: "10.0.0.0/24,169.254.169.254", OutboundPortsExclude: "6379"}},
	{"outbound-ports-include", Options{OutboundPortsInclude: "3306,5432"}},
	{"exclude-interface", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", ExcludeInterfaces: "net1"}},
	{"kubevirt", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RerouteVirtualInterfaces: "eth1"}},
	{"kubevirt-cidr", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "10.0.0.0/8", RerouteVirtualInterfaces: "eth1"}},
	{"dns", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RedirectDNS: true, DNSServers: []string{"10.96.0.10"}}},
	{"dns-capture-all", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RedirectDNS: true, CaptureAllDNS: true}},
	{"dns-ipv6", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RedirectDNS: true, DNSServers: []string{"10.96.0.10", "fd00:10:96::a"}, EnableIPv6: true}},
	{"dns-no-servers", Options{OutboundIPRangesInclude: "*", RedirectDNS: true}},
	{"owner-groups-include", Options{OutboundIPRangesInclude: "*", OwnerGroupsInclude: "java,202"}},
	{"owner-groups-exclude", Options{OutboundIPRangesInclude: "*", OwnerGroupsExclude: "888,ftp"}},
	{"multi-uid", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", ProxyUID: "3,4", ProxyGID: "1,2", RedirectDNS: true, DNSServers: []string{"10.96.0.10"}}},
	{"loopback-include", Options{OutboundIPRangesInclude: "127.1.2.3/32"}},
	{"host-loopback-cidr", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", HostIPv4LoopbackCidr: "127.0.0.1/8"}},
	{"tproxy", Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "*", InboundPortsExclude: sidecarInboundExclude, OutboundIPRangesInclude: "*"}},
	{"tproxy-ports", Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "8080"}},
	{"tproxy-ipv6", Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "*", OutboundIPRangesInclude: "*", EnableIPv6: true, ExcludeInterfaces: "net1"}},
	{"tproxy-kubevirt", Options{InboundInterceptionMode: "TPROXY", InboundPortsInclude: "*", OutboundIPRangesInclude: "*", RerouteVirtualInterfaces: "eth1"}},
	{"drop-invalid", Options{InboundPortsInclude: "*", OutboundIPRangesInclude: "*", DropInvalid: true}},
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
