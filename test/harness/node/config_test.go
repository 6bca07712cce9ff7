package node

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

var testLayout = layout{state: "/var/lib/n"}

func TestPtpConflistIsAValidChainWithHostLocalInOurDirs(t *testing.T) {
	data, err := ptpConflist(testLayout, netip.MustParsePrefix("10.244.7.0/24"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni rejects the conflist: %v\n%s", err, data)
	}
	if list.Name != networkName || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "ptp" {
		t.Fatalf("want one ptp plugin in network %s, got %+v", networkName, list)
	}
	var ptp struct {
		IPMasq bool `json:"ipMasq"`
		IPAM   struct {
			Type    string                `json:"type"`
			Ranges  [][]map[string]string `json:"ranges"`
			DataDir string                `json:"dataDir"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &ptp); err != nil {
		t.Fatal(err)
	}
	if ptp.IPMasq {
		t.Error("ipMasq on: ptp would add iptables rules to the host")
	}
	if ptp.IPAM.Type != "host-local" || ptp.IPAM.Ranges[0][0]["subnet"] != "10.244.7.0/24" {
		t.Errorf("ipam %+v, want host-local over 10.244.7.0/24", ptp.IPAM)
	}
	if !strings.HasPrefix(ptp.IPAM.DataDir, testLayout.state+"/") {
		t.Errorf("host-local dataDir %q outside the state dir (the default is the host's /var/lib/cni)", ptp.IPAM.DataDir)
	}
}

func TestPtpConflistRefusesRangesItCannotServe(t *testing.T) {
	for _, p := range []string{"fd00::/64", "10.0.0.0/31", "10.0.0.1/32"} {
		if _, err := ptpConflist(testLayout, netip.MustParsePrefix(p), netip.Prefix{}); err == nil {
			t.Errorf("pod CIDR %s accepted", p)
		}
	}
	for _, p := range []string{"10.1.0.0/16", "fd00::/127", "::ffff:10.0.0.0/104"} {
		if _, err := ptpConflist(testLayout, netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix(p)); err == nil {
			t.Errorf("IPv6 pod CIDR %s accepted", p)
		}
	}
}

// Dual stack: a second range set and a default route per family, IPv4 first so the
// pod's primary address (status.podIP) stays IPv4.
func TestPtpConflistDualStack(t *testing.T) {
	data, err := ptpConflist(testLayout, netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64"))
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni rejects the conflist: %v\n%s", err, data)
	}
	var ptp struct {
		IPAM struct {
			Ranges [][]map[string]string `json:"ranges"`
			Routes []map[string]string   `json:"routes"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &ptp); err != nil {
		t.Fatal(err)
	}
	want := [][]map[string]string{{{"subnet": "10.244.7.0/24"}}, {{"subnet": "fd00:10:244:7::/64"}}}
	if diff := cmp.Diff(want, ptp.IPAM.Ranges); diff != "" {
		t.Errorf("ranges (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}}, ptp.IPAM.Routes); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
}

func TestContainerdConfigKeepsEverythingInTheStateDir(t *testing.T) {
	toml := containerdTOML(testLayout, "istio-cni.local/pause:v1", "/var/lib/n/bin/runc")
	for _, want := range []string{
		`version = 3`,
		`root = "/var/lib/n/containerd/root"`,
		`state = "/var/lib/n/containerd/state"`,
		`address = "/var/lib/n/containerd/containerd.sock"`,
		`path = "/var/lib/n/containerd/opt"`,
		`Root = "/var/lib/n/containerd/runc"`,
		`bin_dirs = ["/var/lib/n/cni/bin"]`,
		`conf_dir = "/var/lib/n/cni/net.d"`,
		`sandbox = "istio-cni.local/pause:v1"`,
		`BinaryName = "/var/lib/n/bin/runc"`,
		`cdi_spec_dirs = ["/var/lib/n/cdi"]`,
		`config_path = "/var/lib/n/containerd/certs.d"`,
		"[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true",
		`restrict_oom_score_adj = true`,
		`netns_mounts_under_state_dir = true`,
		`SystemdCgroup = false`,
	} {
		if !strings.Contains(toml, want) {
			t.Errorf("containerd config lacks %s", want)
		}
	}
	for _, line := range strings.Split(toml, "\n") {
		if strings.Contains(line, `"/`) && !strings.Contains(line, `"/var/lib/n/`) {
			t.Errorf("path outside the state dir: %s", strings.TrimSpace(line))
		}
	}
}

func TestKubeletConfigHasThisMachinesSettings(t *testing.T) {
	var cfg map[string]any
	if err := yaml.UnmarshalStrict([]byte(kubeletYAML(testLayout, netip.MustParseAddr("192.0.2.2"), 10250, 10248, "/ca.crt")), &cfg); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"cgroupDriver":             "cgroupfs",
		"cgroupsPerQOS":            false,
		"failSwapOn":               false,
		"failCgroupV1":             false,
		"makeIPTablesUtilChains":   false,
		"containerRuntimeEndpoint": "unix:///var/lib/n/containerd/containerd.sock",
		"podLogsDir":               "/var/lib/n/pod-logs",
		"port":                     float64(10250),
		"readOnlyPort":             float64(0),
	} {
		if cfg[key] != want {
			t.Errorf("%s = %v, want %v", key, cfg[key], want)
		}
	}
	if v, ok := cfg["enforceNodeAllocatable"].([]any); !ok || len(v) != 0 {
		t.Errorf("enforceNodeAllocatable = %v, want []", cfg["enforceNodeAllocatable"])
	}
}

// The kubelet and kube-proxy ignore keys they do not know (a misspelt
// podLogsDirectory once sent every pod's logs to the host's /var/log/pods): decode
// both configs strictly into the components' own types.
func TestKubeletAndKubeProxyConfigsHaveOnlyKnownKeys(t *testing.T) {
	var kc kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict([]byte(kubeletYAML(testLayout, netip.MustParseAddr("192.0.2.2"), 10250, 10248, "/ca.crt")), &kc); err != nil {
		t.Errorf("kubelet config: %v", err)
	}
	if kc.PodLogsDir != testLayout.podLogs() {
		t.Errorf("kubelet podLogsDir = %q, want %q", kc.PodLogsDir, testLayout.podLogs())
	}
	var pc kubeproxyv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict([]byte(kubeProxyYAML("/kc", "n", netip.MustParsePrefix("10.244.0.0/24"), 1, 2)), &pc); err != nil {
		t.Errorf("kube-proxy config: %v", err)
	}
	if pc.Mode != "nftables" {
		t.Errorf("kube-proxy mode = %q, want nftables", pc.Mode)
	}
}
