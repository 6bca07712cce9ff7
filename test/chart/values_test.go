package chart

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// networkConfig returns the ConfigMap's cni_network_config parsed as JSON.
func networkConfig(t *testing.T, m *manifest) map[string]any {
	t.Helper()
	text, ok := m.configMap(t).Data["cni_network_config"]
	if !ok {
		t.Fatal("ConfigMap istio-cni-config has no cni_network_config")
	}
	var conf map[string]any
	if err := json.Unmarshal([]byte(text), &conf); err != nil {
		t.Fatalf("cni_network_config is not JSON: %v\n%s", err, text)
	}
	return conf
}

func chartAppVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(chartDir + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if c.AppVersion == "" {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return c.AppVersion
}

// TestNetworkConfigHoldsEveryFieldAndThePluginAcceptsIt: the rendered cni_network_config is
// JSON holding every field of the plugin's entry with the chart's values, and the plugin's
// own config parser accepts it once the agent has filled in the kubeconfig path.
func TestNetworkConfigHoldsEveryFieldAndThePluginAcceptsIt(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want map[string]any
		// level is the level the plugin reads, when not want's plugin_log_level.
		level string
	}{{
		name: "defaults",
		want: map[string]any{
			"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
			"plugin_log_level":   "warn",
			"cni_agent_run_dir":  "/var/run/istio-cni",
			"exclude_namespaces": []any{"istio-system"},
			"pod_namespace":      "kube-system",
			"native_nftables":    false,
			"kubernetes": map[string]any{
				"kubeconfig":         "__KUBECONFIG_FILEPATH__",
				"cni_bin_dir":        "/opt/cni/bin",
				"exclude_namespaces": []any{"istio-system"},
			},
		},
	}, {
		name: "every value changed",
		args: []string{"--namespace", "istio-cni-system", "--set", "logLevel=debug", "--set", "cniAgentRunDir=/run/mesh",
			"--set", "excludeNamespaces={istio-system,foo-ns,bar-ns}", "--set", "nativeNftables=true",
			"--set", "cniBinDir=/home/kubernetes/bin", "--set", "resourceQuotas.enabled=true"}, // GKE outside kube-system needs the quota
		want: map[string]any{
			"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
			"plugin_log_level":   "debug",
			"cni_agent_run_dir":  "/run/mesh",
			"exclude_namespaces": []any{"istio-system", "foo-ns", "bar-ns"},
			"pod_namespace":      "istio-cni-system",
			"native_nftables":    true,
			"kubernetes": map[string]any{
				"kubeconfig":         "__KUBECONFIG_FILEPATH__",
				"cni_bin_dir":        "/home/kubernetes/bin",
				"exclude_namespaces": []any{"istio-system", "foo-ns", "bar-ns"},
			},
		},
	}, {
		name: "no excluded namespace",
		args: []string{"--set", "excludeNamespaces={}"},
		want: map[string]any{
			"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
			"plugin_log_level":   "warn",
			"cni_agent_run_dir":  "/var/run/istio-cni",
			"exclude_namespaces": []any{},
			"pod_namespace":      "kube-system",
			"native_nftables":    false,
			"kubernetes": map[string]any{
				"kubeconfig":         "__KUBECONFIG_FILEPATH__",
				"cni_bin_dir":        "/opt/cni/bin",
				"exclude_namespaces": []any{},
			},
		},
	}, {
		// Istio's plugin reads an empty level as its default, as the plugin here does.
		name: "an empty log level is the plugin's default",
		args: []string{"--set-string", "logLevel="},
		want: map[string]any{
			"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
			"plugin_log_level":   "",
			"cni_agent_run_dir":  "/var/run/istio-cni",
			"exclude_namespaces": []any{"istio-system"},
			"pod_namespace":      "kube-system",
			"native_nftables":    false,
			"kubernetes": map[string]any{
				"kubeconfig":         "__KUBECONFIG_FILEPATH__",
				"cni_bin_dir":        "/opt/cni/bin",
				"exclude_namespaces": []any{"istio-system"},
			},
		},
		level: "info",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A later --namespace overrides templateArgs' kube-system.
			m := mustRender(t, c.args...)
			conf := networkConfig(t, m)
			if diff := cmp.Diff(c.want, conf); diff != "" {
				t.Errorf("cni_network_config (-want +got):\n%s", diff)
			}

			// What the agent writes into the node's config: the same entry with the path.
			text := strings.ReplaceAll(m.configMap(t).Data["cni_network_config"], "__KUBECONFIG_FILEPATH__", "/var/run/istio-cni/istio-cni-kubeconfig")
			cfg, err := plugin.ParseConfig([]byte(text))
			if err != nil {
				t.Fatalf("the plugin refuses the rendered config: %v", err)
			}
			wantLevel := c.want["plugin_log_level"].(string)
			if c.level != "" {
				wantLevel = c.level
			}
			if string(cfg.LogLevel) != wantLevel {
				t.Errorf("plugin reads log level %q, want %v", cfg.LogLevel, wantLevel)
			}
			if cfg.AgentRunDir != c.want["cni_agent_run_dir"] {
				t.Errorf("plugin reads run dir %q, want %v", cfg.AgentRunDir, c.want["cni_agent_run_dir"])
			}
			if cfg.PodNamespace != c.want["pod_namespace"] {
				t.Errorf("plugin reads pod namespace %q, want %v", cfg.PodNamespace, c.want["pod_namespace"])
			}
			var wantNS []string
			for _, ns := range c.want["exclude_namespaces"].([]any) {
				wantNS = append(wantNS, ns.(string))
			}
			if diff := cmp.Diff(wantNS, cfg.ExcludeNamespaces, cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })); diff != "" {
				t.Errorf("plugin reads excluded namespaces (-want +got):\n%s", diff)
			}
			wantBackend := plugin.BackendIptables
			if c.want["native_nftables"] == true {
				wantBackend = plugin.BackendNftables
			}
			if cfg.Backend != wantBackend {
				t.Errorf("plugin picks backend %q, want %q", cfg.Backend, wantBackend)
			}
		})
	}
}

// TestValuesReachTheObjects: each value ends up where the agent, the plugin or the
// kubelet reads it.
func TestValuesReachTheObjects(t *testing.T) {
	appVersion := chartAppVersion(t)
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name string
		args []string
		// env are variables of the agent's container and their values (a
		// valueFrom as "fieldRef:path" or "configMapKeyRef:name/key").
		env map[string]string
		// unset are variables the agent's container must not have.
		unset []string
		// paths, when set, are every host path mounted and its mount path.
		paths map[string]string
		// check, when set, checks the rest.
		check func(t *testing.T, m *manifest)
	}{{
		name: "bin and conf dirs are mounted from the node and named to the agent",
		args: []string{"--set", "cniBinDir=/var/lib/cni/bin", "--set", "cniConfDir=/etc/cni/multus/net.d"},
		env: map[string]string{
			"CNI_NET_DIR":         "/etc/cni/multus/net.d",
			"MOUNTED_CNI_NET_DIR": "/host/etc/cni/net.d",
			"CNI_BIN_DIR":         "/var/lib/cni/bin",
			"MOUNTED_CNI_BIN_DIR": "/host/opt/cni/bin",
		},
		paths: map[string]string{
			"/var/lib/cni/bin":      "/host/opt/cni/bin",
			"/etc/cni/multus/net.d": "/host/etc/cni/net.d",
			"/var/run/istio-cni":    "/var/run/istio-cni",
			"/usr":                  "/host/usr",
			"/sbin":                 "/host/sbin",
			"/bin":                  "/host/bin",
		},
	}, {
		name: "defaults mount /opt/cni/bin and /etc/cni/net.d, and for the node check the node's /usr, /sbin and /bin",
		paths: map[string]string{
			"/opt/cni/bin":       "/host/opt/cni/bin",
			"/etc/cni/net.d":     "/host/etc/cni/net.d",
			"/var/run/istio-cni": "/var/run/istio-cni",
			"/usr":               "/host/usr",
			"/sbin":              "/host/sbin",
			"/bin":               "/host/bin",
		},
	}, {
		name: "the node check's mounts of the node's /usr, /sbin and /bin are read-only, of directories the node has, under NODE_DIRS_ROOT",
		env:  map[string]string{"NODE_DIRS_ROOT": "/host"},
		check: func(t *testing.T, m *manifest) {
			wantToolDirs(t, m, true)
		},
	}, {
		name:  "no node check mounts in nftables mode, which runs no tool of the node's",
		args:  []string{"--set", "nativeNftables=true"},
		unset: []string{"NODE_DIRS_ROOT"},
		check: func(t *testing.T, m *manifest) { wantToolDirs(t, m, false) },
	}, {
		name:  "no node check mounts with nodeCheck.mountToolDirs=false",
		args:  []string{"--set", "nodeCheck.mountToolDirs=false"},
		unset: []string{"NODE_DIRS_ROOT"},
		check: func(t *testing.T, m *manifest) { wantToolDirs(t, m, false) },
	}, {
		name:  "no node check mounts where the node's /proc shows all of it",
		args:  []string{"--set", "repair.repairPods=true"},
		unset: []string{"NODE_DIRS_ROOT"},
		check: func(t *testing.T, m *manifest) { wantToolDirs(t, m, false) },
	}, {
		name: "the run dir is mounted at the node's own path",
		args: []string{"--set", "cniAgentRunDir=/run/mesh-cni"},
		env: map[string]string{
			"CNI_AGENT_RUN_DIR": "/run/mesh-cni",
		},
		check: func(t *testing.T, m *manifest) {
			wantMounted(t, m, map[string]string{"/run/mesh-cni": "/run/mesh-cni"})
		},
	}, {
		name: "excluded namespaces, log level, chained, conf file name and nftables reach the agent",
		args: []string{"--set", "excludeNamespaces={istio-system,kube-system}", "--set", "logLevel=error",
			"--set", "chained=false", "--set", "cniConfFileName=istio-cni.conf", "--set", "nativeNftables=true",
			"--set-string", "kubeconfigMode=0640", "--set", "agentLogLevel=debug", "--set", "agentLogAsJson=true"},
		env: map[string]string{
			"EXCLUDE_NAMESPACES": "istio-system,kube-system",
			"PLUGIN_LOG_LEVEL":   "error",
			"CHAINED_CNI_PLUGIN": "false",
			"CNI_CONF_NAME":      "istio-cni.conf",
			"NATIVE_NFTABLES":    "true",
			"KUBECONFIG_MODE":    "0640",
			"AGENT_LOG_LEVEL":    "debug",
			"AGENT_LOG_AS_JSON":  "true",
			"CNI_NETWORK_CONFIG": "configMapKeyRef:istio-cni-config/cni_network_config",
			"POD_NAMESPACE":      "fieldRef:metadata.namespace",
		},
	}, {
		name: "defaults: chained, no conf file name, warn",
		env: map[string]string{
			"CHAINED_CNI_PLUGIN": "true",
			"PLUGIN_LOG_LEVEL":   "warn",
			"EXCLUDE_NAMESPACES": "istio-system",
		},
		// Without cniConfFileName the agent picks the file as the runtime does.
		unset: []string{"CNI_CONF_NAME"},
	}, {
		name: "the tag defaults to the chart's appVersion",
		check: func(t *testing.T, m *manifest) {
			if got, want := m.agent(t).Image, "registry.example.com/mesh/install-cni:"+appVersion; got != want {
				t.Errorf("image %q, want %q", got, want)
			}
			// No pull policy given: the field is left out and Kubernetes picks one
			// (IfNotPresent for a versioned tag), as Istio's chart does.
			if got := m.agent(t).ImagePullPolicy; got != "" {
				t.Errorf("imagePullPolicy %q, want none (Kubernetes' default)", got)
			}
			if ds := m.find("DaemonSet", "istio-cni-node"); bytes.Contains(ds.raw, []byte("imagePullPolicy")) {
				t.Error("the DaemonSet writes imagePullPolicy although pullPolicy and global.imagePullPolicy are empty")
			}
		},
	}, {
		name: "a digest replaces the tag",
		args: []string{"--set", "hub=registry.example.com/mesh", "--set", "tag=1.2.3", "--set", "digest=" + digest},
		check: func(t *testing.T, m *manifest) {
			if got, want := m.agent(t).Image, "registry.example.com/mesh/install-cni@"+digest; got != want {
				t.Errorf("image %q, want %q", got, want)
			}
		},
	}, {
		name: "repair settings reach the agent",
		args: []string{"--set", "repair.deletePods=false", "--set", "repair.initContainerName=mesh-check",
			"--set", "repair.brokenPodLabelKey=example.com/broken", "--set", "repair.brokenPodLabelValue=yes"},
		env: map[string]string{
			"REPAIR_ENABLED":                "true",
			"REPAIR_LABEL_PODS":             "true",
			"REPAIR_DELETE_PODS":            "false",
			"REPAIR_REPAIR_PODS":            "false",
			"REPAIR_INIT_CONTAINER_NAME":    "mesh-check",
			"REPAIR_BROKEN_POD_LABEL_KEY":   "example.com/broken",
			"REPAIR_BROKEN_POD_LABEL_VALUE": "yes",
			"REPAIR_NODE_NAME":              "fieldRef:spec.nodeName",
		},
		unset: []string{"REPAIR_PROC_DIR"}, // no repair in place
	}, {
		name: "seed defaults reach the controller, which lets deletePods win over labelPods",
		env: map[string]string{
			"REPAIR_ENABLED":                "true",
			"REPAIR_REPAIR_PODS":            "false",
			"REPAIR_DELETE_PODS":            "true",
			"REPAIR_LABEL_PODS":             "true",
			"REPAIR_INIT_CONTAINER_NAME":    "istio-validation",
			"REPAIR_BROKEN_POD_LABEL_KEY":   "cni.istio.io/uninitialized",
			"REPAIR_BROKEN_POD_LABEL_VALUE": "true",
		},
	}, {
		name: "repair in place finds pods' namespaces through the node's /proc and /var/run/netns",
		args: []string{"--set", "repair.repairPods=true"},
		env: map[string]string{
			"REPAIR_REPAIR_PODS": "true",
			"REPAIR_PROC_DIR":    "/host/proc",
			"REPAIR_NETNS_DIRS":  "/host/var/run/netns",
		},
		check: func(t *testing.T, m *manifest) {
			wantMounted(t, m, map[string]string{"/proc": "/host/proc", "/var/run/netns": "/host/var/run/netns"})
			for _, vm := range m.agent(t).VolumeMounts {
				if vm.MountPath == "/host/var/run/netns" && (vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationHostToContainer) {
					t.Errorf("/host/var/run/netns propagation %v, want HostToContainer (namespaces mounted later must show)", vm.MountPropagation)
				}
			}
		},
	}, {
		name: "troubleshooting mounts the node's /proc and /var/run/netns for the doctor, and sets no repair setting",
		args: []string{"--set", "troubleshooting.enabled=true"},
		env: map[string]string{
			"REPAIR_REPAIR_PODS": "false",
		},
		unset: []string{"REPAIR_PROC_DIR", "REPAIR_NETNS_DIRS"}, // the repair does not enter namespaces here
		check: func(t *testing.T, m *manifest) {
			// The doctor's defaults.
			wantMounted(t, m, map[string]string{"/proc": "/host/proc", "/var/run/netns": "/host/var/run/netns"})
			for _, vm := range m.agent(t).VolumeMounts {
				if (vm.MountPath == "/host/proc" || vm.MountPath == "/host/var/run/netns") && !vm.ReadOnly {
					t.Errorf("%s is writable, want read-only", vm.MountPath)
				}
			}
		},
	}, {
		name: "repair off leaves no repair setting but the switch",
		args: []string{"--set", "repair.enabled=false"},
		env: map[string]string{
			"REPAIR_ENABLED": "false",
		},
		check: func(t *testing.T, m *manifest) {
			env := m.env(t)
			for k := range env {
				if strings.HasPrefix(k, "REPAIR_") && k != "REPAIR_ENABLED" {
					t.Errorf("%s set although repair is off", k)
				}
			}
		},
	}, {
		// Istio's chart renders it, and Istio's install-cni runs a controller that
		// does nothing with a broken pod: off here, and the notes say why.
		name: "repair with every action off, which Istio's chart takes, is off",
		args: []string{"--set", "repair.repairPods=false", "--set", "repair.deletePods=false", "--set", "repair.labelPods=false"},
		env: map[string]string{
			"REPAIR_ENABLED": "false",
		},
		check: func(t *testing.T, m *manifest) {
			env := m.env(t)
			for k := range env {
				if strings.HasPrefix(k, "REPAIR_") && k != "REPAIR_ENABLED" {
					t.Errorf("%s set although repair is off", k)
				}
			}
		},
	}, {
		name: "taint settings reach the agent",
		args: []string{"--set", "taint.enabled=true", "--set", "taint.key=example.com/cni-not-ready", "--set", "taint.effect=PreferNoSchedule"},
		env: map[string]string{
			"TAINT_ENABLED": "true",
			"TAINT_KEY":     "example.com/cni-not-ready",
			"TAINT_EFFECT":  "PreferNoSchedule",
			// The DaemonSet's nodeSelector and default affinity: nodes it never runs on
			// are not tainted.
			"TAINT_NODE_LABEL_SELECTOR": "kubernetes.io/os=linux,eks.amazonaws.com/compute-type notin (fargate),type notin (virtual-kubelet)",
			"POD_NAME":                  "fieldRef:metadata.name", // the identity in the lease
			// The election polls every 15 s, not client-go's 2 s: at 5,000 nodes the
			// standbys' Lease GETs were the API server's largest load (README, scale).
			"TAINT_RETRY_PERIOD":   "15s",
			"TAINT_RENEW_DEADLINE": "20s",
			"TAINT_LEASE_DURATION": "40s",
		},
	}, {
		name: "the taint election's timing is a chart value",
		args: []string{"--set", "taint.enabled=true", "--set", "taint.retryPeriod=1m", "--set", "taint.renewDeadline=90s", "--set", "taint.leaseDuration=3m"},
		env: map[string]string{
			"TAINT_RETRY_PERIOD":   "1m",
			"TAINT_RENEW_DEADLINE": "90s",
			"TAINT_LEASE_DURATION": "3m",
		},
	}, {
		name:  "no taint election setting when the taint is off",
		unset: []string{"TAINT_RETRY_PERIOD", "TAINT_RENEW_DEADLINE", "TAINT_LEASE_DURATION"},
	}, {
		name: "the taint covers every node but virtual ones when the DaemonSet has no nodeSelector",
		args: []string{"--set", "taint.enabled=true", "--set", "nodeSelector=null"},
		env:  map[string]string{"TAINT_NODE_LABEL_SELECTOR": "eks.amazonaws.com/compute-type notin (fargate),type notin (virtual-kubelet)"},
	}, {
		name: "the pod cache is on by default and knows its node from the downward API",
		env: map[string]string{
			"POD_CACHE_ENABLED": "true",
			"NODE_NAME":         "fieldRef:spec.nodeName",
		},
	}, {
		name: "the Go runtime's memory limit is the container's",
		env: map[string]string{
			"GOMEMLIMIT": "resourceFieldRef:limits.memory",
		},
	}, {
		name: "the pod cache can be turned off",
		args: []string{"--set", "podCache.enabled=false"},
		env: map[string]string{
			"POD_CACHE_ENABLED": "false",
		},
	}, {
		name: "runs on every node at node-critical priority on the host network",
		check: func(t *testing.T, m *manifest) {
			spec := m.daemonSet(t).Spec.Template.Spec
			if !tolerates(spec.Tolerations, corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute}) ||
				!tolerates(spec.Tolerations, corev1.Taint{Key: "example.com/anything", Value: "x", Effect: corev1.TaintEffectNoSchedule}) ||
				!tolerates(spec.Tolerations, corev1.Taint{Key: "cni.istio.io/not-ready", Effect: corev1.TaintEffectNoSchedule}) {
				t.Errorf("tolerations %+v do not tolerate every taint", spec.Tolerations)
			}
			if spec.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
			}
			if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				t.Errorf("hostNetwork %v dnsPolicy %q, want true and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
			}
			if diff := cmp.Diff(map[string]string{"kubernetes.io/os": "linux"}, spec.NodeSelector); diff != "" {
				t.Errorf("nodeSelector (-want +got):\n%s", diff)
			}
			if spec.ServiceAccountName != "istio-cni" {
				t.Errorf("serviceAccountName %q, want istio-cni", spec.ServiceAccountName)
			}
			us := m.daemonSet(t).Spec.UpdateStrategy
			if us.Type != "RollingUpdate" || us.RollingUpdate == nil || us.RollingUpdate.MaxUnavailable == nil ||
				*us.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
				t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 1", us)
			}
		},
	}, {
		name: "scheduling values are passed through",
		args: []string{"-f", "testdata/values/all-features.yaml", "--set", "priorityClassName=mesh-critical"},
		check: func(t *testing.T, m *manifest) {
			ds := m.daemonSet(t)
			spec := ds.Spec.Template.Spec
			if spec.PriorityClassName != "mesh-critical" {
				t.Errorf("priorityClassName %q", spec.PriorityClassName)
			}
			if spec.NodeSelector["node-role.example.com/mesh"] != "true" {
				t.Errorf("nodeSelector %v lacks node-role.example.com/mesh", spec.NodeSelector)
			}
			if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil ||
				spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "example.com/no-mesh" {
				t.Errorf("affinity %+v not passed through", spec.Affinity)
			}
			if got := ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(); got != "10%" {
				t.Errorf("maxUnavailable %q, want 10%%", got)
			}
			meta := ds.Spec.Template.ObjectMeta
			if meta.Labels["team"] != "mesh" || meta.Annotations["example.com/owner"] != "mesh-team" {
				t.Errorf("pod labels %v / annotations %v lack podLabels / podAnnotations", meta.Labels, meta.Annotations)
			}
			if got := spec.ImagePullSecrets; len(got) != 1 || got[0].Name != "regcred" {
				t.Errorf("imagePullSecrets %v, want regcred", got)
			}
			res := m.agent(t).Resources
			if res.Limits.Memory().String() != "256Mi" || res.Requests.Cpu().String() != "50m" {
				t.Errorf("resources %+v not passed through", res)
			}
		},
	}, {
		name: "probes and metrics use their ports",
		args: []string{"--set", "probes.port=8001", "--set", "monitoringPort=15015"},
		env: map[string]string{
			"MONITORING_PORT": "15015",
			"READINESS_PORT":  "8001",
		},
		check: func(t *testing.T, m *manifest) {
			c := m.agent(t)
			for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port != intstr.FromInt32(8001) {
					t.Errorf("probe %s = %+v, want GET %s on 8001", name, p, name)
				}
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if diff := cmp.Diff(map[string]int32{"metrics": 15015, "health": 8001}, ports); diff != "" {
				t.Errorf("container ports (-want +got):\n%s", diff)
			}
			if got := m.daemonSet(t).Spec.Template.Annotations["prometheus.io/port"]; got != "15015" {
				t.Errorf("prometheus.io/port %q, want 15015", got)
			}
		},
	}, {
		name: "probes may share the monitoring port on its address",
		args: []string{"--set", "probes.port=15014", "--set", "probes.bindAddress="},
		env:  map[string]string{"MONITORING_ADDRESS": "", "READINESS_ADDRESS": ""},
		check: func(t *testing.T, m *manifest) {
			if n := len(m.agent(t).Ports); n != 1 {
				t.Errorf("%d container ports, want 1 (the same port twice is refused)", n)
			}
		},
	}, {
		name:  "by default the probes listen on the node's loopback and metrics on every address",
		env:   map[string]string{"MONITORING_ADDRESS": "", "READINESS_ADDRESS": "127.0.0.1"},
		unset: []string{"HOST_IP"},
		check: func(t *testing.T, m *manifest) {
			c := m.agent(t)
			for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				if p.HTTPGet.Host != "127.0.0.1" {
					t.Errorf("%s probe host %q, want 127.0.0.1 (where the agent listens)", name, p.HTTPGet.Host)
				}
			}
		},
	}, {
		name: "hostIP binds to the node's primary address from the downward API",
		args: []string{"--set", "monitoringBindAddress=hostIP", "--set", "probes.bindAddress=hostIP"},
		env:  map[string]string{"MONITORING_ADDRESS": "$(HOST_IP)", "READINESS_ADDRESS": "$(HOST_IP)"},
		check: func(t *testing.T, m *manifest) {
			c := m.agent(t)
			hostIP := -1
			for i, e := range c.Env {
				if e.Name == "HOST_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP" {
					hostIP = i
				}
				if (e.Name == "MONITORING_ADDRESS" || e.Name == "READINESS_ADDRESS") && (hostIP < 0 || i < hostIP) {
					t.Errorf("%s refers to $(HOST_IP) before HOST_IP is defined (Kubernetes expands only earlier variables)", e.Name)
				}
			}
			if hostIP < 0 {
				t.Error("no HOST_IP from status.hostIP")
			}
			if h := c.ReadinessProbe.HTTPGet.Host; h != "" {
				t.Errorf("readiness probe host %q, want none (the kubelet probes the pod IP, the node's)", h)
			}
		},
	}, {
		name: "an IP address is passed on and probed there",
		args: []string{"--set", "monitoringBindAddress=10.1.2.3", "--set", "probes.bindAddress=fd00::1"},
		env:  map[string]string{"MONITORING_ADDRESS": "10.1.2.3", "READINESS_ADDRESS": "fd00::1"},
		check: func(t *testing.T, m *manifest) {
			if h := m.agent(t).LivenessProbe.HTTPGet.Host; h != "fd00::1" {
				t.Errorf("liveness probe host %q, want fd00::1", h)
			}
		},
	}, {
		name: "agentLogAsJson turns JSON on for the agent and, through it, the plugin",
		args: []string{"--set", "agentLogAsJson=true"},
		env:  map[string]string{"AGENT_LOG_AS_JSON": "true"},
	}, {
		name: "no Prometheus Operator objects or dashboard by default",
		check: func(t *testing.T, m *manifest) {
			for _, d := range m.docs {
				if d.kind == "ServiceMonitor" || d.kind == "PodMonitor" || d.kind == "Service" || strings.HasSuffix(d.name, "-dashboard") {
					t.Errorf("%s rendered by default", d)
				}
			}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, c.args...)
			env := m.env(t)
			wantIn(t, "env", env, c.env)
			for _, name := range c.unset {
				if v, ok := env[name]; ok {
					t.Errorf("env %s=%q set, want it unset", name, v)
				}
			}
			if c.paths != nil {
				if diff := cmp.Diff(c.paths, m.hostPaths(t)); diff != "" {
					t.Errorf("host path -> mount path (-want +got):\n%s", diff)
				}
			}
			if c.check != nil {
				c.check(t, m)
			}
		})
	}
}

// wantToolDirs checks the node check's mounts: with want, each of the node's
// iptables.NodePathDirs read-only (under it too, where the runtime can) at
// /host + the dir, of type Directory (the kubelet refuses a node without it
// rather than the runtime making it in the node's root); without, none of them.
func wantToolDirs(t *testing.T, m *manifest, want bool) {
	t.Helper()
	ds := m.daemonSet(t)
	volumes := map[string]corev1.Volume{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	seen := map[string]bool{}
	for _, vm := range m.agent(t).VolumeMounts {
		v := volumes[vm.Name]
		if v.HostPath == nil || !slices.Contains(iptables.NodePathDirs, v.HostPath.Path) {
			continue
		}
		seen[v.HostPath.Path] = true
		if vm.MountPath != "/host"+v.HostPath.Path {
			t.Errorf("the node's %s is mounted at %s, want /host%s", v.HostPath.Path, vm.MountPath, v.HostPath.Path)
		}
		if !vm.ReadOnly || vm.RecursiveReadOnly == nil || *vm.RecursiveReadOnly != corev1.RecursiveReadOnlyIfPossible || vm.MountPropagation != nil {
			t.Errorf("the node's %s: readOnly %v, recursiveReadOnly %v, propagation %v; want read-only, IfPossible, none", v.HostPath.Path, vm.ReadOnly, vm.RecursiveReadOnly, vm.MountPropagation)
		}
		if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
			t.Errorf("the node's %s: hostPath type %v, want Directory", v.HostPath.Path, v.HostPath.Type)
		}
	}
	for _, d := range iptables.NodePathDirs {
		if seen[d] != want {
			t.Errorf("the node's %s mounted: %v, want %v", d, seen[d], want)
		}
	}
}

// wantMounted checks that each host path of want is mounted into the agent at its
// mount path.
func wantMounted(t *testing.T, m *manifest, want map[string]string) {
	t.Helper()
	wantIn(t, "host path -> mount path", m.hostPaths(t), want)
}

// wantIn checks that got holds each key of want with its value; what names got.
func wantIn(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := got[k]; !ok {
			t.Errorf("%s: %s missing, want %q", what, k, want[k])
		} else if v != want[k] {
			t.Errorf("%s: %s=%q, want %q", what, k, v, want[k])
		}
	}
}

func tolerates(tolerations []corev1.Toleration, taint corev1.Taint) bool {
	for _, tol := range tolerations {
		if tol.ToleratesTaint(klog.Background(), &taint, false) {
			return true
		}
	}
	return false
}

// TestConfigChangeRollsTheAgents: a change of the plugin's config changes the pod
// template (env from a ConfigMap is read only when a container starts).
func TestConfigChangeRollsTheAgents(t *testing.T) {
	a := mustRender(t).daemonSet(t).Spec.Template.Annotations["checksum/config"]
	b := mustRender(t, "--set", "excludeNamespaces={istio-system,foo}").daemonSet(t).Spec.Template.Annotations["checksum/config"]
	if a == "" || a == b {
		t.Errorf("checksum/config %q -> %q: want a non-empty checksum that changes with the config", a, b)
	}
}

// grants flattens every ClusterRole and Role of the render into "scope group resource
// name verb" lines (scope "cluster" or the Role's namespace, name "*" for any), and checks
// each role is bound to the agent's ServiceAccount and nothing else; the plugin's own
// ServiceAccount's grants are checked separately (pluginGrants).
func grants(t *testing.T, m *manifest) []string {
	t.Helper()
	return grantsOf(t, m, "istio-cni")
}

// pluginGrants are the grants of the plugin's ServiceAccount, istio-cni-plugin.
func pluginGrants(t *testing.T, m *manifest) []string {
	t.Helper()
	return grantsOf(t, m, "istio-cni-plugin")
}

func grantsOf(t *testing.T, m *manifest, account string) []string {
	t.Helper()
	bound := map[string]bool{}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, d := range m.all(kind) {
			var subjects []rbacv1.Subject
			var ref rbacv1.RoleRef
			switch b := d.object.(type) {
			case *rbacv1.ClusterRoleBinding:
				subjects, ref = b.Subjects, b.RoleRef
			case *rbacv1.RoleBinding:
				subjects, ref = b.Subjects, b.RoleRef
			}
			if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Namespace != namespace ||
				subjects[0].Name != "istio-cni" && subjects[0].Name != "istio-cni-plugin" {
				t.Errorf("%s binds %+v, want only ServiceAccount %s/istio-cni or %s/istio-cni-plugin", d, subjects, namespace, namespace)
			}
			if subjects[0].Name == account {
				bound[ref.Kind+"/"+ref.Name] = true
			}
		}
	}
	var out []string
	add := func(scope string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						names := r.ResourceNames
						if len(names) == 0 {
							names = []string{"*"}
						}
						for _, n := range names {
							out = append(out, strings.Join([]string{scope, g, res, n, v}, " "))
						}
					}
				}
			}
		}
	}
	for _, d := range m.all("ClusterRole") {
		if bound["ClusterRole/"+d.name] {
			add("cluster", d.object.(*rbacv1.ClusterRole).Rules)
		}
	}
	for _, d := range m.all("Role") {
		if bound["Role/"+d.name] {
			add(d.ns, d.object.(*rbacv1.Role).Rules)
		}
	}
	sort.Strings(out)
	return out
}

// TestRBACGrantsExactlyWhatEnabledFeaturesNeed: the agent's permissions, as a flat list
// of scope/group/resource/name/verb, for each combination of features.
func TestRBACGrantsExactlyWhatEnabledFeaturesNeed(t *testing.T) {
	// Always: on exit the agent reads its pod, its DaemonSet (any name: a canary
	// DaemonSet's agent reads its own) and the node, and lists the DaemonSets of its
	// namespace (another of the agent still on the node keeps the plugin), and it
	// requests the plugin's token, watching the plugin's ServiceAccount (deleted or
	// created again, the token is refused).
	podGet := "cluster  pods * get"
	always := []string{podGet, "cluster  nodes * get", "kube-system apps daemonsets * get", "kube-system apps daemonsets * list",
		"kube-system  serviceaccounts/token istio-cni-plugin create",
		"kube-system  serviceaccounts istio-cni-plugin list", "kube-system  serviceaccounts istio-cni-plugin watch"}
	watchPods := []string{"cluster  pods * list", "cluster  pods * watch"}
	// The pod cache serves namespaces' labels too.
	watchNamespaces := []string{"cluster  namespaces * list", "cluster  namespaces * watch"}
	events := []string{"cluster  events * create", "cluster  events * patch"}
	deletePods := "cluster  pods * delete"
	// The controller labels through the status subresource, which cannot touch the spec.
	labelPods := "cluster  pods/status * patch"
	// The Multus leader creates NetworkAttachmentDefinitions, owned by the ClusterRole.
	multusNADs := []string{
		"cluster k8s.cni.cncf.io network-attachment-definitions * create",
		"cluster k8s.cni.cncf.io network-attachment-definitions * list",
		"cluster k8s.cni.cncf.io network-attachment-definitions * watch",
		"cluster rbac.authorization.k8s.io clusterroles istio-cni get",
		"kube-system coordination.k8s.io leases * create",
		"kube-system coordination.k8s.io leases istio-cni-multus get",
		"kube-system coordination.k8s.io leases istio-cni-multus update",
	}
	// Multus means OpenShift in practice, whose admission wants the SCC for the agent pod.
	scc := "cluster security.openshift.io securitycontextconstraints privileged use"
	cases := []struct {
		name string
		args []string
		want []string
	}{{
		name: "no optional feature: exit decision and plugin token only",
		args: []string{"--set", "repair.enabled=false", "--set", "podCache.enabled=false"},
		want: nil,
	}, {
		name: "the pod cache watches pods and namespaces",
		args: []string{"--set", "repair.enabled=false"},
		want: concat([]string{}, watchPods, watchNamespaces),
	}, {
		name: "repair without the pod cache watches pods too",
		args: []string{"--set", "podCache.enabled=false", "--set", "repair.deletePods=false"},
		want: concat([]string{labelPods}, watchPods, events),
	}, {
		name: "repair with every action off, which does nothing (Istio's chart takes it): no grant for it",
		args: []string{"--set", "repair.deletePods=false", "--set", "repair.labelPods=false"},
		want: concat([]string{}, watchPods, watchNamespaces),
	}, {
		name: "repair by deleting (the seed's defaults)",
		want: concat([]string{deletePods}, watchPods, events, watchNamespaces),
	}, {
		name: "repair by labelling",
		args: []string{"--set", "repair.deletePods=false"},
		want: concat([]string{labelPods}, watchPods, events, watchNamespaces),
	}, {
		name: "repair in place removes the label of an earlier run",
		args: []string{"--set", "repair.repairPods=true", "--set", "repair.deletePods=false", "--set", "repair.labelPods=false"},
		want: concat([]string{labelPods}, watchPods, events, watchNamespaces),
	}, {
		name: "repair in place falls back to deleting",
		args: []string{"--set", "repair.repairPods=true"},
		want: concat([]string{deletePods, labelPods}, watchPods, events, watchNamespaces),
	}, {
		name: "node readiness taints nodes and elects a leader in its namespace",
		args: []string{"--set", "repair.enabled=false", "--set", "podCache.enabled=false", "--set", "taint.enabled=true"},
		want: []string{
			"cluster  nodes * list", "cluster  nodes * patch", "cluster  nodes * watch",
			// Which nodes a DaemonSet of the agent runs on: only those are tainted.
			"kube-system apps daemonsets * list", "kube-system apps daemonsets * watch",
			"kube-system coordination.k8s.io leases * create",
			"kube-system coordination.k8s.io leases istio-cni-taint get",
			"kube-system coordination.k8s.io leases istio-cni-taint update",
			"kube-system  pods * list", "kube-system  pods * watch",
		},
	}, {
		name: "multus with the chart's namespaces only: repair labels a pod missing the network",
		args: []string{"--set", "podCache.enabled=false", "--set", "chained=false", "--set", "multus.enabled=true", "--set", "multus.meshedNamespaces=false"},
		want: concat([]string{deletePods, labelPods, scc}, watchPods, events),
	}, {
		name: "multus in meshed namespaces: one agent creates, never updates or deletes, the NetworkAttachmentDefinitions",
		args: []string{"--set", "repair.enabled=false", "--set", "podCache.enabled=false", "--set", "chained=false", "--set", "multus.enabled=true"},
		want: concat([]string{scc}, watchPods, watchNamespaces, multusNADs),
	}, {
		name: "multus in meshed namespaces with the pod cache: namespaces are listed and watched by one rule",
		args: []string{"--set", "repair.enabled=false", "--set", "chained=false", "--set", "multus.enabled=true"},
		want: concat([]string{scc}, watchPods, watchNamespaces, multusNADs),
	}, {
		name: "privileged (OpenShift) may use the privileged SCC",
		args: []string{"--set", "repair.enabled=false", "--set", "podCache.enabled=false", "--set", "privileged=true"},
		want: []string{scc},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := grants(t, mustRender(t, c.args...))
			want := concat(always, c.want)
			sort.Strings(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("grants (-want +got):\n%s", diff)
			}
		})
	}
}

// TestThePluginsServiceAccountMayOnlyGetPodsAndNamespaces: the token on the node (the
// plugin's kubeconfig) is of istio-cni-plugin, whatever the agent's features.
func TestThePluginsServiceAccountMayOnlyGetPodsAndNamespaces(t *testing.T) {
	for _, args := range [][]string{nil, {"--set", "taint.enabled=true", "--set", "repair.repairPods=true"}} {
		m := mustRender(t, args...)
		if diff := cmp.Diff([]string{"cluster  namespaces * get", "cluster  pods * get"}, pluginGrants(t, m)); diff != "" {
			t.Errorf("%v: the plugin's grants (-want +got):\n%s", args, diff)
		}
		env := map[string]string{}
		for _, e := range m.daemonSet(t).Spec.Template.Spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		if env["PLUGIN_SERVICE_ACCOUNT"] != "istio-cni-plugin" {
			t.Errorf("%v: the agent's PLUGIN_SERVICE_ACCOUNT is %q, want istio-cni-plugin", args, env["PLUGIN_SERVICE_ACCOUNT"])
		}
		if sa := m.find("ServiceAccount", "istio-cni-plugin"); sa == nil {
			t.Errorf("%v: no ServiceAccount istio-cni-plugin", args)
		}
	}
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestPSPClusterRoleIsBoundOnlyWhenNamed: psp_cluster_role adds a RoleBinding of that
// ClusterRole to the agent in the release namespace, and nothing else; no policy object.
func TestPSPClusterRoleIsBoundOnlyWhenNamed(t *testing.T) {
	for _, d := range mustRender(t).all("RoleBinding") {
		if strings.HasPrefix(d.name, "istio-cni-psp") {
			t.Errorf("%s rendered without psp_cluster_role", d)
		}
	}
	m := mustRender(t, "--set", "psp_cluster_role=psp:privileged")
	d := m.find("RoleBinding", "istio-cni-psp-psp:privileged")
	if d == nil {
		t.Fatal("no RoleBinding istio-cni-psp-psp:privileged with psp_cluster_role set")
	}
	rb := d.object.(*rbacv1.RoleBinding)
	want := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "psp:privileged"}
	if diff := cmp.Diff(want, rb.RoleRef); diff != "" {
		t.Errorf("roleRef (-want +got):\n%s", diff)
	}
	if rb.Namespace != namespace {
		t.Errorf("namespace %q, want the release namespace %s", rb.Namespace, namespace)
	}
	for _, doc := range m.docs {
		if doc.kind == "PodSecurityPolicy" {
			t.Errorf("%s rendered: PodSecurityPolicy is gone since Kubernetes 1.25", doc)
		}
	}
}

// TestPrivilegeFollowsTheSwitches: privileged only with the OpenShift switch; otherwise
// every capability dropped and only those the enabled features need added back.
func TestPrivilegeFollowsTheSwitches(t *testing.T) {
	netnsCaps := []corev1.Capability{"DAC_OVERRIDE", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}
	doctorCaps := []corev1.Capability{"DAC_OVERRIDE", "NET_ADMIN", "NET_RAW", "SETGID", "SETUID", "SYS_ADMIN", "SYS_PTRACE"}
	cases := []struct {
		name       string
		args       []string
		privileged bool
		caps       []corev1.Capability
		hostProc   bool
		toolDirs   bool // the node check's read-only /usr, /sbin and /bin
	}{
		{name: "defaults", caps: []corev1.Capability{"DAC_OVERRIDE"}, toolDirs: true},
		{name: "repair in place enters pod namespaces", args: []string{"--set", "repair.repairPods=true"}, caps: netnsCaps, hostProc: true},
		{name: "repair in place needs repair on", args: []string{"--set", "repair.repairPods=true", "--set", "repair.enabled=false"}, caps: []corev1.Capability{"DAC_OVERRIDE"}, toolDirs: true},
		{name: "troubleshooting lets the doctor enter pod namespaces", args: []string{"--set", "troubleshooting.enabled=true"}, caps: doctorCaps, hostProc: true},
		{name: "troubleshooting without repair", args: []string{"--set", "troubleshooting.enabled=true", "--set", "repair.enabled=false"}, caps: doctorCaps, hostProc: true},
		{name: "troubleshooting and repair in place", args: []string{"--set", "troubleshooting.enabled=true", "--set", "repair.repairPods=true"}, caps: doctorCaps, hostProc: true},
		{name: "privileged", args: []string{"--set", "privileged=true"}, privileged: true, toolDirs: true},
		{name: "privileged with troubleshooting", args: []string{"--set", "privileged=true", "--set", "troubleshooting.enabled=true"}, privileged: true, hostProc: true},
		{name: "privileged with repair in place", args: []string{"--set", "privileged=true", "--set", "repair.repairPods=true"}, privileged: true, hostProc: true},
		{name: "privileged and nothing else", args: []string{"--set", "privileged=true", "--set", "repair.enabled=false"}, privileged: true, toolDirs: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, c.args...)
			sc := m.agent(t).SecurityContext
			if sc == nil || sc.Privileged == nil {
				t.Fatal("install-cni has no securityContext.privileged")
			}
			if *sc.Privileged != c.privileged {
				t.Errorf("privileged %v, want %v", *sc.Privileged, c.privileged)
			}
			var add []corev1.Capability
			if sc.Capabilities != nil {
				add = slices.Clone(sc.Capabilities.Add)
				slices.Sort(add)
				if !c.privileged && !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
					t.Errorf("drop %v, want [ALL]", sc.Capabilities.Drop)
				}
			}
			if diff := cmp.Diff(c.caps, add); diff != "" {
				t.Errorf("added capabilities (-want +got):\n%s", diff)
			}
			_, proc := m.hostPaths(t)["/proc"]
			if proc != c.hostProc {
				t.Errorf("node's /proc mounted: %v, want %v", proc, c.hostProc)
			}
			wantToolDirs(t, m, c.toolDirs)
			checkSecurityContextRules(t, m)
		})
	}
}

// TestMultusNetworkAttachmentDefinition: the OpenShift profile writes a standalone
// istio-cni.conf into Multus' directory and creates the NetworkAttachmentDefinition whose
// name is the network name in that file, which is how Multus resolves the pod annotation
// k8s.v1.cni.cncf.io/networks: istio-cni; other profiles create none.
func TestMultusNetworkAttachmentDefinition(t *testing.T) {
	for _, p := range []string{"default", "gke"} {
		if nads := mustRender(t, "-f", profileFile(p)).all("NetworkAttachmentDefinition"); len(nads) != 0 {
			t.Errorf("profile %s renders %v", p, nads)
		}
	}
	m := mustRender(t, "-f", profileFile("openshift"), "--set", "multus.namespaces={default,bookinfo}")
	var got []string
	for _, d := range m.all("NetworkAttachmentDefinition") {
		if err := checkNetworkAttachmentDefinition(d.raw); err != nil {
			t.Errorf("%s: %v", d, err)
		}
		got = append(got, d.ns+"/"+d.name)
	}
	if diff := cmp.Diff([]string{"default/istio-cni", "bookinfo/istio-cni"}, got); diff != "" {
		t.Errorf("NetworkAttachmentDefinitions (-want +got):\n%s", diff)
	}
	if name := networkConfig(t, m)["name"]; name != "istio-cni" {
		t.Errorf("network name %v in the standalone config, want istio-cni (the NetworkAttachmentDefinition's name)", name)
	}
	wantIn(t, "env", m.env(t), map[string]string{
		"CHAINED_CNI_PLUGIN": "false", "CNI_NET_DIR": "/etc/cni/multus/net.d",
		"MULTUS_ENABLED": "true", "MULTUS_MESHED_NAMESPACES": "true",
		// The agent leaves the chart's namespaces to helm, and its own objects go with the
		// chart's ClusterRole.
		"MULTUS_STATIC_NAMESPACES": "default,bookinfo", "MULTUS_NAD_OWNER_CLUSTERROLE": "istio-cni",
	})
	if m.find("ClusterRole", "istio-cni") == nil {
		t.Error("MULTUS_NAD_OWNER_CLUSTERROLE names istio-cni, but the chart renders no such ClusterRole")
	}
	// With the agent off, only the listed namespaces get the object, and the agent is told nothing more.
	only := mustRender(t, "-f", profileFile("openshift"), "--set", "multus.meshedNamespaces=false")
	for _, name := range []string{"MULTUS_MESHED_NAMESPACES", "MULTUS_STATIC_NAMESPACES", "MULTUS_NAD_OWNER_CLUSTERROLE"} {
		if v, set := only.env(t)[name]; set {
			t.Errorf("multus.meshedNamespaces=false, yet %s=%q", name, v)
		}
	}
	if only.find("Role", "istio-cni-multus") != nil {
		t.Error("multus.meshedNamespaces=false, yet the Role istio-cni-multus is rendered")
	}
	// The agent alone may serve every namespace.
	if nads := mustRender(t, "-f", profileFile("openshift"), "--set", "multus.namespaces={}").all("NetworkAttachmentDefinition"); len(nads) != 0 {
		t.Errorf("multus.namespaces={} renders %v", nads)
	}
	if name, set := m.env(t)["CNI_CONF_NAME"]; set {
		t.Errorf("CNI_CONF_NAME=%q: the profile must leave the standalone file's name to the agent's default, which sorts after every network config", name)
	}
	wantMounted(t, m, map[string]string{"/var/lib/cni/bin": "/host/opt/cni/bin"})
	if sc := m.agent(t).SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the OpenShift profile's agent is not privileged")
	}
}

// TestGKEProfileUsesHomeKubernetesBin: GKE's kubelet runs CNI binaries from
// /home/kubernetes/bin.
func TestGKEProfileUsesHomeKubernetesBin(t *testing.T) {
	m := mustRender(t, "-f", profileFile("gke"))
	wantMounted(t, m, map[string]string{"/home/kubernetes/bin": "/host/opt/cni/bin"})
	if got := networkConfig(t, m)["kubernetes"].(map[string]any)["cni_bin_dir"]; got != "/home/kubernetes/bin" {
		t.Errorf("kubernetes.cni_bin_dir %v, want /home/kubernetes/bin", got)
	}
}

// TestGKEOutsideKubeSystemNeedsTheResourceQuota: GKE admits pods of the
// system-node-critical (and system-cluster-critical) priority class outside kube-system
// only in a namespace with a ResourceQuota on that class ("insufficient quota to match
// these scopes"): GKE's bin dir (set, or detected from a -gke Kubernetes version) in
// istio-system, Istio's namespace, without resourceQuotas would be a DaemonSet none of
// whose pods is ever created. The chart refuses it, saying what to set; with the quota, or
// in kube-system, or off GKE, it renders. GKE's platform (its profile names it) turns the
// quota on there itself.
func TestGKEOutsideKubeSystemNeedsTheResourceQuota(t *testing.T) {
	wantRefused(t, []string{"--set", "cniBinDir=/home/kubernetes/bin", "--namespace", "istio-system"},
		[]string{"GKE", "istio-system", "system-node-critical", "resourceQuotas.enabled=true", "kube-system"})
	for _, args := range [][]string{
		{"--set", "cniBinDir=/home/kubernetes/bin", "--namespace", "istio-system", "--set", "resourceQuotas.enabled=true"},
		{"-f", profileFile("gke"), "--namespace", "istio-system"},
		{"-f", profileFile("gke"), "--namespace", "istio-system", "--set", "resourceQuotas.enabled=true"},
	} {
		m := mustRender(t, args...)
		if d := m.find("ResourceQuota", "istio-cni-resource-quota"); d == nil || d.ns != "istio-system" {
			t.Errorf("%v: ResourceQuota %v, want one in istio-system", args, d)
		}
	}
	for _, args := range [][]string{
		{"-f", profileFile("gke")}, // kube-system: GKE admits the class there
		{"-f", profileFile("gke"), "--namespace", "istio-system", "--set", "priorityClassName=mesh-node"},
		{"--set", "cniBinDir=/home/kubernetes/bin", "--namespace", "istio-system", "--set", "priorityClassName=mesh-node"},
		{"-f", profileFile("default"), "--namespace", "istio-system"}, // not GKE
	} {
		if m := mustRender(t, args...); m.find("ResourceQuota", "istio-cni-resource-quota") != nil {
			t.Errorf("%v: a ResourceQuota without resourceQuotas.enabled", args)
		}
	}
}

// TestBadValuesAreRefusedNamingThem: helm refuses each bad value before rendering, with
// a message that names the key and the value.
func TestBadValuesAreRefusedNamingThem(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string // substrings of the error
	}{
		{"unknown log level", []string{"--set", "logLevel=verbose"}, []string{"/logLevel", "'verbose'"}},
		{"relative bin dir", []string{"--set", "cniBinDir=opt/cni/bin"}, []string{"/cniBinDir", "'opt/cni/bin'"}},
		{"relative conf dir", []string{"--set", "cniConfDir=etc/cni/net.d"}, []string{"/cniConfDir", "'etc/cni/net.d'"}},
		{"relative run dir", []string{"--set", "cniAgentRunDir=run"}, []string{"/cniAgentRunDir", "'run'"}},
		{"conf file name with a directory", []string{"--set", "cniConfFileName=../10-x.conflist"}, []string{"/cniConfFileName", "'../10-x.conflist'"}},
		// The agent refuses a lifetime outside 10m-8760h at start.
		{"plugin token lifetime under 10m", []string{"--set", "pluginTokenLifetime=5m"}, []string{"pluginTokenLifetime", "5m", "10m", "8760h"}},
		{"plugin token lifetime over a year", []string{"--set", "pluginTokenLifetime=8761h"}, []string{"pluginTokenLifetime", "8761h", "10m", "8760h"}},
		// The agent writes a standalone config as one plugin, and refuses a .conflist name at start.
		{"standalone config named as a list", []string{"--set", "chained=false", "--set", "cniConfFileName=zz-istio-cni.conflist"},
			[]string{"cniConfFileName", `"zz-istio-cni.conflist"`, "chained is false", ".conf or .json"}},
		{"negative monitoring port", []string{"--set", "monitoringPort=-1"}, []string{"/monitoringPort", "got -1"}},
		{"zero probe port", []string{"--set", "probes.port=0"}, []string{"/probes/port", "got 0"}},
		{"bind address not an IP", []string{"--set", "monitoringBindAddress=node-a"}, []string{"/monitoringBindAddress", "'node-a'"}},
		{"probe bind address not an IP", []string{"--set", "probes.bindAddress=256.1.1.1"}, []string{"/probes/bindAddress", "'256.1.1.1'"}},
		{"shared port on two addresses", []string{"--set", "probes.port=15014"},
			[]string{"probes.port and monitoringPort are both 15014", `probes.bindAddress "127.0.0.1"`, `monitoringBindAddress ""`}},
		{"scrape interval not a duration", []string{"--set-string", "monitoring.serviceMonitor.interval=30"}, []string{"/monitoring/serviceMonitor/interval", "'30'"}},
		{"misspelt monitor key", []string{"--set", "monitoring.podMonitor.enable=true"}, []string{"/monitoring/podMonitor", "'enable'"}},
		{"negative grace period", []string{"--set", "terminationGracePeriodSeconds=-5"}, []string{"/terminationGracePeriodSeconds", "got -5"}},
		{"probe period over a probe's int32", []string{"--set", "probes.periodSeconds=2147483648"}, []string{"/probes/periodSeconds", "maximum"}},
		{"probe delay over a probe's int32", []string{"--set", "probes.initialDelaySeconds=2147483648"}, []string{"/probes/initialDelaySeconds", "maximum"}},
		{"grace period over what helm reads exactly", []string{"--set", "terminationGracePeriodSeconds=9007199254740992"}, []string{"/terminationGracePeriodSeconds", "maximum"}},
		{"grace period shorter than the agent's exit", []string{"--set", "terminationGracePeriodSeconds=2"}, []string{"/terminationGracePeriodSeconds", "got 2"}},
		{"negative maxUnavailable", []string{"--set", "updateStrategy.rollingUpdate.maxUnavailable=-1"}, []string{"/updateStrategy/rollingUpdate/maxUnavailable", "got -1"}},
		{"surge pod beside the old one", []string{"--set", "updateStrategy.rollingUpdate.maxSurge=1", "--set", "updateStrategy.rollingUpdate.maxUnavailable=0"},
			[]string{"updateStrategy.rollingUpdate.maxSurge is 1", "host network", "15014", "8000", "hang"}},
		{"surge as a percentage", []string{"--set", "updateStrategy.rollingUpdate.maxSurge=10%"}, []string{"updateStrategy.rollingUpdate.maxSurge is 10%", "host network"}},
		{"Localhost seccomp profile without a file", []string{"--set", "seccompProfile.type=Localhost"}, []string{"/seccompProfile", "missing property 'localhostProfile'"}},
		{"seccomp file without Localhost", []string{"--set", "seccompProfile.localhostProfile=profiles/cni.json"}, []string{"/seccompProfile/type", "'Localhost'"}},
		{"Localhost AppArmor profile without a name", []string{"--set", "appArmorProfile.type=Localhost"}, []string{"/appArmorProfile", "missing property 'localhostProfile'"}},
		{"Localhost AppArmor annotation without a name", []string{"--set", "appArmorProfile.type=Localhost", "--set", "useAppArmorAnnotation=true"}, []string{"/appArmorProfile", "missing property 'localhostProfile'"}},
		{"AppArmor profile name without a type", []string{"--set", "appArmorProfile.localhostProfile=istio-cni"}, []string{"/appArmorProfile", "missing property 'type'"}},
		{"AppArmor profile name with another type", []string{"--set", "appArmorProfile.type=RuntimeDefault", "--set", "appArmorProfile.localhostProfile=istio-cni"}, []string{"/appArmorProfile/type", "'Localhost'"}},
		{"empty Localhost profile name", []string{"--set", "appArmorProfile.type=Localhost", "--set", "appArmorProfile.localhostProfile="}, []string{"/appArmorProfile/localhostProfile", "minLength"}},
		{"pod label the selector uses", []string{"--set", "podLabels.k8s-app=mine"}, []string{"podLabels.k8s-app", "the DaemonSet's selector", "remove it"}},
		{"pod label against injection", []string{"--set-string", `podLabels.sidecar\.istio\.io/inject=true`}, []string{"podLabels.sidecar.istio.io/inject", "injector"}},
		{"pod label of the chart's common ones", []string{"--set", `podLabels.app\.kubernetes\.io/name=mine`}, []string{"podLabels.app.kubernetes.io/name", "common labels"}},
		{"DaemonSet label of the agents", []string{"--set", "daemonSetLabels.k8s-app=mine"}, []string{"daemonSetLabels.k8s-app", "remove it from daemonSetLabels"}},
		{"DaemonSet label of the chart's", []string{"--set", `daemonSetLabels.app\.kubernetes\.io/part-of=mesh`}, []string{"daemonSetLabels.app.kubernetes.io/part-of", "chart's labels"}},
		{"DaemonSet label of Istio's revision", []string{"--set", "revision=canary", "--set", `daemonSetLabels.istio\.io/rev=other`}, []string{"daemonSetLabels.istio.io/rev"}},
		{"service monitor label of the chart's", []string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", `monitoring.serviceMonitor.labels.app\.kubernetes\.io/name=prom`},
			[]string{"monitoring.serviceMonitor.labels.app.kubernetes.io/name", "remove it from monitoring.serviceMonitor.labels"}},
		{"pod monitor label of Istio's owner", []string{"--set", "ownerName=mesh", "--set", "monitoring.podMonitor.enabled=true", "--set", `monitoring.podMonitor.labels.install\.operator\.istio\.io/owning-resource=x`},
			[]string{"monitoring.podMonitor.labels.install.operator.istio.io/owning-resource"}},
		{"dashboard label of the chart's", []string{"--set", "dashboard.enabled=true", "--set", "dashboard.label=app.kubernetes.io/part-of"}, []string{"dashboard.label app.kubernetes.io/part-of", "LABEL"}},
		{"pod annotation of the metrics port", []string{"--set-string", `podAnnotations.prometheus\.io/port=9090`}, []string{"podAnnotations.prometheus.io/port", "monitoringPort"}},
		{"pod annotation of scraping", []string{"--set-string", `podAnnotations.prometheus\.io/scrape=false`}, []string{"podAnnotations.prometheus.io/scrape"}},
		{"pod annotation against injection", []string{"--set-string", `podAnnotations.sidecar\.istio\.io/inject=true`}, []string{"podAnnotations.sidecar.istio.io/inject"}},
		{"pod annotation of the config checksum", []string{"--set-string", `podAnnotations.checksum/config=x`}, []string{"podAnnotations.checksum/config"}},
		{"pod annotation of AppArmor", []string{"--set-string", `podAnnotations.container\.apparmor\.security\.beta\.kubernetes\.io/install-cni=unconfined`},
			[]string{"podAnnotations.container.apparmor.security.beta.kubernetes.io/install-cni", "appArmorProfile"}},
		{"unknown top-level key", []string{"--set", "excludeNamespace={foo}"}, []string{"additional properties 'excludeNamespace' not allowed"}},
		{"misspelt repair key", []string{"--set", "repair.labelpods=true"}, []string{"/repair", "'labelpods'"}},
		{"pod cache switch not a boolean", []string{"--set-string", "podCache.enabled=yes"}, []string{"/podCache/enabled", "want boolean"}},
		{"ambient mode", []string{"--set", "ambient.enabled=true"}, []string{"ambient.enabled is true", "no ambient mode"}},
		{"ambient through the agent's environment", []string{"--set-string", "env.AMBIENT_ENABLED=true"}, []string{"env.AMBIENT_ENABLED", "no ambient mode"}},
		{"short digest", []string{"--set", "digest=sha256:abc"}, []string{"/digest", "'sha256:abc'"}},
		{"unknown pull policy", []string{"--set", "pullPolicy=Sometimes"}, []string{"/pullPolicy", "'Sometimes'"}},
		{"namespace that cannot exist", []string{"--set", "excludeNamespaces={Foo_Bar}"}, []string{"/excludeNamespaces/0", "'Foo_Bar'"}},
		{"hub with a trailing slash", []string{"--set", "hub=ghcr.io/x/"}, []string{"/hub", "'ghcr.io/x/'"}},
		{"hub emptied (no default hub, as in the repository)", []string{"--set", "hub=", "--set", "defaultHub="}, []string{"hub is not set", "make push HUB=", "--set hub="}},
		{"chained not a boolean", []string{"--set-string", "chained=maybe"}, []string{"/chained", "want boolean"}},
		{"kubeconfig mode the owner cannot read", []string{"--set-string", "kubeconfigMode=0200"}, []string{"/kubeconfigMode", "'0200'"}},
		{"negative memory request", []string{"--set", "resources.requests.memory=-1"}, []string{"/resources/requests/memory", "got -1"}},
		{"negative memory limit as a quantity", []string{"--set", "resources.limits.memory=-64Mi"}, []string{"/resources/limits/memory", "'-64Mi'"}},
		{"kubeconfig mode not octal", []string{"--set-string", "kubeconfigMode=0999"}, []string{"/kubeconfigMode", "'0999'"}},
		{"unknown agent log level", []string{"--set", "agentLogLevel=trace"}, []string{"/agentLogLevel", "'trace'"}},
		{"unknown taint effect", []string{"--set", "taint.effect=Sometimes"}, []string{"/taint/effect", "'Sometimes'"}},
		// The taint is set at every agent restart: NoExecute would evict the node's pods.
		{"NoExecute taint effect", []string{"--set", "taint.enabled=true", "--set", "taint.effect=NoExecute"}, []string{"/taint/effect", "'NoExecute'"}},
		{"taint retry period without a unit", []string{"--set-string", "taint.retryPeriod=15"}, []string{"/taint/retryPeriod", "'15'"}},
		{"negative taint lease duration", []string{"--set", "taint.leaseDuration=-30s"}, []string{"/taint/leaseDuration", "'-30s'"}},
		{"taint renew deadline not above 1.2 x retry period", []string{"--set", "taint.enabled=true", "--set", "taint.retryPeriod=500ms", "--set", "taint.renewDeadline=600ms", "--set", "taint.leaseDuration=1s"},
			[]string{"taint.renewDeadline 600ms", "1.2 x taint.retryPeriod (500ms)"}},
		{"taint lease not above the renew deadline", []string{"--set", "taint.enabled=true", "--set", "taint.renewDeadline=1m30s", "--set", "taint.leaseDuration=1.5m"},
			[]string{"taint.leaseDuration 1.5m", "taint.renewDeadline 1m30s", "taint.retryPeriod 15s"}},
		// The chart's old default: a leader whose renewals fail acts until 20s + 15s
		// after its last renewal, a standby may take the Lease after 30s.
		{"taint lease not above the renew deadline plus the retry period", []string{"--set", "taint.enabled=true", "--set", "taint.leaseDuration=30s"},
			[]string{"taint.leaseDuration 30s", "taint.renewDeadline 20s", "taint.retryPeriod 15s", "two would taint nodes at once"}},
		{"owner name that is no label value", []string{"--set", "ownerName=my owner"}, []string{"/ownerName", "'my owner'"}},
		{"node selector key that is no label key", []string{"--set", "nodeSelector.bad key=x"}, []string{"/nodeSelector", "'bad key'"}},
		{"node selector value that is no label value", []string{"--set", "nodeSelector.pool=a b"}, []string{"/nodeSelector/pool", "'a b'"}},
		{"toleration key that is no taint key", []string{"--set", "tolerations[0].key=bad key", "--set", "tolerations[0].operator=Exists"}, []string{"/tolerations/0/key", "'bad key'"}},
		{"toleration value that is no label value", []string{"--set", "tolerations[0].key=pool", "--set", "tolerations[0].value=a b"}, []string{"/tolerations/0/value", "'a b'"}},
		{"pod annotation key that is no annotation key", []string{"--set", "podAnnotations.bad key=x"}, []string{"/podAnnotations", "'bad key'"}},
		// A key of a map is named with the map it is in (a propertyNames schema put
		// another key's path on its error).
		{"pod label key that is no label key", []string{"--set", "podLabels.bad key=x"}, []string{"/podLabels", "'bad key'"}},
		{"DaemonSet label key that is no label key", []string{"--set", "daemonSetLabels.bad key=x"}, []string{"/daemonSetLabels", "'bad key'"}},
		{"monitor label key that is no label key", []string{"--set", "monitoring.serviceMonitor.labels.bad key=x"}, []string{"/monitoring/serviceMonitor/labels", "'bad key'"}},
		{"dashboard annotation key that is no annotation key", []string{"--set", "dashboard.annotations.bad key=x"}, []string{"/dashboard/annotations", "'bad key'"}},
		{"env name that is no variable name", []string{"--set", "env.1BAD=x"}, []string{"/env", "'1BAD'"}},
		{"bad broken-pod label key", []string{"--set", "repair.brokenPodLabelKey=bad key"}, []string{"/repair/brokenPodLabelKey", "'bad key'"}},
		{"multus while chained", []string{"--set", "multus.enabled=true"}, []string{"multus.enabled", "chained", "standalone"}},
		{"multus with no namespace at all", []string{"-f", profileFile("openshift"), "--set", "multus.namespaces={}", "--set", "multus.meshedNamespaces=false"},
			[]string{"multus.namespaces", "multus.meshedNamespaces", "every meshed pod would fail"}},
		{"multus namespace that cannot exist", []string{"-f", profileFile("openshift"), "--set", "multus.namespaces={Book_Info}"}, []string{"/multus/namespaces/0", "'Book_Info'"}},
		{"multus agent switch not a boolean", []string{"--set-string", "multus.meshedNamespaces=yes"}, []string{"/multus/meshedNamespaces", "want boolean"}},
		{"repair image other than the agent's", []string{"--set", "repair.hub=other.example.com/mesh"}, []string{"repair.hub", `"other.example.com/mesh"`}},
		{"repair tag other than the agent's", []string{"--set", "tag=1.0", "--set", "repair.tag=2.0"}, []string{"repair.tag", `"2.0"`, `"1.0"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want) })
	}
}

// TestTaintTimingsInAnyGoForm: the render-time check of the Lease timings reads
// every form of Go duration the schema admits, and the values reach the agent as
// written.
func TestTaintTimingsInAnyGoForm(t *testing.T) {
	for _, c := range [][3]string{{"15s", "20s", "40s"}, {"500ms", "601ms", "1.2s"}, {"1.5s", "1m30s", "0.5h"}, {"1m", "1h1m", "2h"}, {"50s", "1m1s", "1m52s"}} {
		m, err := render(t, "--set", "taint.enabled=true", "--set", "taint.retryPeriod="+c[0], "--set", "taint.renewDeadline="+c[1], "--set", "taint.leaseDuration="+c[2])
		if err != nil {
			t.Errorf("timings %v refused: %v", c, err)
			continue
		}
		env := m.env(t)
		for i, name := range []string{"TAINT_RETRY_PERIOD", "TAINT_RENEW_DEADLINE", "TAINT_LEASE_DURATION"} {
			if env[name] != c[i] {
				t.Errorf("timings %v: the agent's %s is %q, want %q", c, name, env[name], c[i])
			}
		}
	}
}

// wantRefused: rendering with args fails with an error holding every string of want.
func wantRefused(t *testing.T, args, want []string) {
	t.Helper()
	_, err := render(t, args...)
	if err == nil {
		t.Fatalf("helm template %v succeeded, want it refused", args)
	}
	wanterr.Mentions(t, err, want...)
}

// TestChartWithoutHubFailsSayingHowToPush: the chart in the repository names no
// registry (none holds the image until the user pushes it): installing it as it is
// fails before anything is created, with a message that names the value to set and
// the commands that push the image and install the chart that goes with it.
func TestChartWithoutHubFailsSayingHowToPush(t *testing.T) {
	for _, p := range profiles {
		_, err := helm(t, "template", release, chartDir, "--namespace", namespace, "-f", profileFile(p))
		if err == nil {
			t.Fatalf("profile %s without hub rendered; want it refused", p)
		}
		for _, w := range []string{"hub is not set", "make push HUB=registry.example.com/mesh TAG=1.0.0",
			"helm install istio-cni oci://registry.example.com/mesh/charts/istio-cni --version 1.0.0", "--set hub="} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("profile %s: the error does not say %q:\n%v", p, w, err)
			}
		}
	}
}

// TestRepairImageMayRepeatTheAgents: the seed's repair.hub and repair.tag are accepted
// when they name the agent's own image.
func TestRepairImageMayRepeatTheAgents(t *testing.T) {
	mustRender(t, "--set", "hub=docker.io/example", "--set", "tag=1.0", "--set", "repair.hub=docker.io/example", "--set", "repair.tag=1.0")
}

// TestNoSurgeIsAccepted: a maxSurge of 0 (Kubernetes' own default for a DaemonSet) is
// accepted in either form; only a surge above it is refused (TestBadValuesAreRefusedNamingThem).
func TestNoSurgeIsAccepted(t *testing.T) {
	for _, surge := range []string{"0", "0%"} {
		m := mustRender(t, "--set", "updateStrategy.rollingUpdate.maxSurge="+surge)
		if got := m.daemonSet(t).Spec.UpdateStrategy.RollingUpdate.MaxSurge; got == nil || got.String() != surge {
			t.Errorf("maxSurge %s rendered as %v", surge, got)
		}
	}
}

// TestPodMetadataCannotRepeatTheChartsKeys: every label and annotation the chart itself
// writes on the agent pods is refused in podLabels and podAnnotations, naming the key,
// instead of being written twice into the pod template (which no validator accepts).
func TestPodMetadataCannotRepeatTheChartsKeys(t *testing.T) {
	m := mustRender(t, "--set", "appArmorProfile.type=Unconfined", "--set", "useAppArmorAnnotation=true")
	meta := m.daemonSet(t).Spec.Template.ObjectMeta
	for value, keys := range map[string]map[string]string{"podLabels": meta.Labels, "podAnnotations": meta.Annotations} {
		for _, key := range slices.Sorted(maps.Keys(keys)) {
			t.Run(value+"."+key, func(t *testing.T) {
				wantRefused(t, valuesFile(t, map[string]any{value: map[string]string{key: "mine"}}), []string{value + "." + key, "remove it"})
			})
		}
	}
}
