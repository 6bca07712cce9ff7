package node

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// layout is where every file of one node lives, all under the state directory.
type layout struct {
	state string
}

func (l layout) path(parts ...string) string {
	return l.state + "/" + strings.Join(parts, "/")
}

func (l layout) containerdConfig() string { return l.path("containerd", "config.toml") }
func (l layout) containerdRoot() string   { return l.path("containerd", "root") }
func (l layout) containerdState() string  { return l.path("containerd", "state") }
func (l layout) containerdSocket() string { return l.path("containerd", "containerd.sock") }
func (l layout) runcRoot() string         { return l.path("containerd", "runc") }
func (l layout) containerdOpt() string    { return l.path("containerd", "opt") }
func (l layout) cniBinDir() string        { return l.path("cni", "bin") }
func (l layout) cniConfDir() string       { return l.path("cni", "net.d") }
func (l layout) ipamDir() string          { return l.path("cni", "ipam") }
func (l layout) kubeletRoot() string      { return l.path("kubelet") }
func (l layout) kubeletConfig() string    { return l.path("kubelet-config.yaml") }
func (l layout) podLogs() string          { return l.path("pod-logs") }
func (l layout) staticPods() string       { return l.path("static-pods") }
func (l layout) logDir() string           { return l.path("logs") }
func (l layout) imagesDir() string        { return l.path("images") }
func (l layout) kubeconfigDir() string    { return l.path("kubeconfig") }
func (l layout) hostSnapshot() string     { return l.path("host-before.json") }

// registryHostsDir is containerd's per-registry configuration (hosts.toml, CAs):
// ours, not the default /etc/containerd/certs.d and /etc/docker/certs.d.
func (l layout) registryHostsDir() string { return l.path("containerd", "certs.d") }

// containerdTOML is containerd 2.x's whole configuration (version 3): nothing is
// read from /etc/containerd, NRI is off (its socket would be /var/run/nri), CDI
// specs are looked for under the state dir, and every path containerd writes is one
// of ours except what it hard-codes (/run/containerd/s for shim sockets, libcni's
// /var/lib/cni), which hostPaths covers.
func containerdTOML(l layout, sandboxImage, runcPath string) string {
	q := strconv.Quote
	return `version = 3
root = ` + q(l.containerdRoot()) + `
state = ` + q(l.containerdState()) + `
# Snapshotters that cannot work here only log errors at every start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = ` + q(l.containerdSocket()) + `

[plugins."io.containerd.internal.v1.opt"]
  path = ` + q(l.containerdOpt()) + `

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = ` + q(sandboxImage) + `
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = ` + q(l.registryHostsDir()) + `

[plugins."io.containerd.cri.v1.runtime"]
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # Network namespaces under our state dir rather than the host's /var/run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = [` + q(l.path("cdi")) + `]

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [` + q(l.cniBinDir()) + `]
    conf_dir = ` + q(l.cniConfDir()) + `
    max_conf_num = 1

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = ` + q(runcPath) + `
        Root = ` + q(l.runcRoot()) + `
        SystemdCgroup = false
`
}

// networkName names the primary network; libcni's cache files start with it.
const networkName = "istio-cni-node"

// ptpConflist is the primary network: ptp (a veth per pod, a /32 route on the host,
// no bridge, no iptables since ipMasq is off) with host-local addresses from podCIDR
// and, when v6 is valid, also from v6 (dual-stack pods, IPv4 first).
func ptpConflist(l layout, podCIDR, v6 netip.Prefix) ([]byte, error) {
	if !podCIDR.Addr().Is4() || podCIDR.Bits() > 30 {
		return nil, fmt.Errorf("pod CIDR %s: want an IPv4 prefix of /30 or larger", podCIDR)
	}
	ranges := [][]map[string]string{{{"subnet": podCIDR.Masked().String()}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if v6.IsValid() {
		if !v6.Addr().Is6() || v6.Addr().Is4In6() || v6.Bits() > 120 {
			return nil, fmt.Errorf("IPv6 pod CIDR %s: want an IPv6 prefix of /120 or larger", v6)
		}
		ranges = append(ranges, []map[string]string{{"subnet": v6.Masked().String()}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	conf := map[string]any{
		"cniVersion": "1.1.0", // STATUS and GC exist from 1.1.0: containerd 2.x runs STATUS
		"name":       networkName,
		"plugins": []any{map[string]any{
			"type":   "ptp",
			"ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  ranges,
				"routes":  routes,
				"dataDir": l.ipamDir(),
			},
		}},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeProxyYAML is the KubeProxyConfiguration: nftables mode (tables of its own,
// nothing in the host's iptables), and every conntrack setting left as the host has
// it (0), since kube-proxy would otherwise tune the host's conntrack table.
func kubeProxyYAML(kubeconfig, nodeName string, podCIDR netip.Prefix, healthzPort, metricsPort int) string {
	return `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: ` + kubeconfig + `
hostnameOverride: ` + nodeName + `
clusterCIDR: ` + podCIDR.Masked().String() + `
healthzBindAddress: 127.0.0.1:` + strconv.Itoa(healthzPort) + `
metricsBindAddress: 127.0.0.1:` + strconv.Itoa(metricsPort) + `
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`
}

// kubeletYAML is the KubeletConfiguration for this machine: cgroup v1 without
// systemd, no QoS cgroups or allocatable enforcement, no swap check, no iptables
// utility chains, our containerd, ports chosen by Up.
func kubeletYAML(l layout, nodeIP netip.Addr, port, healthzPort int, clientCAFile string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://` + l.containerdSocket() + `
address: ` + nodeIP.String() + `
port: ` + strconv.Itoa(port) + `
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ` + strconv.Itoa(healthzPort) + `
podLogsDir: ` + l.podLogs() + `
# Static pods: their manifests, read at once on a change (inotify), and at
# least every 5 s.
staticPodPath: ` + l.staticPods() + `
fileCheckFrequency: 5s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ` + clientCAFile + `
authorization:
  mode: Webhook
serializeImagePulls: false
# Locally imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A developer machine's disk or memory must not evict the node's pods.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
nodeStatusUpdateFrequency: 4s
`
}
