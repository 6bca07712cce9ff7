package chart

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// istioFile is a values file written for Istio's own istio-cni chart (testdata/istio).
func istioFile(name string) string { return filepath.Join("testdata", "istio", name+".yaml") }

// istioFiles are Istio's default values and realistic override files; each is rendered,
// validated offline (variants) and traced value by value (TestIstioValuesReachTheObjects).
var istioFiles = []string{"default", "nested-cni", "private-registry", "openshift", "gke", "resources-seccomp", "repair"}

// istioArgs renders Istio's values file name in the namespace its user installs it in:
// istio-system, Istio's own, for the files that turn resourceQuotas on (Istio's GKE
// values), which the chart refuses in kube-system (TestResourceQuotaIsRefusedInKubeSystem);
// kube-system, this chart's, for the others.
func istioArgs(name string) []string {
	args := []string{"-f", istioFile(name)}
	if name == "gke" || name == "nested-cni" {
		args = append(args, "--namespace", "istio-system")
	}
	return args
}

// placed is one value of a values file and where the render must show it.
type placed struct {
	value string // the key in the values file, as Istio names it
	where string // the object and field that carries it
	got   func(t *testing.T, m *manifest) any
	want  any
}

func envOf(name string) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any { return m.env(t)[name] }
}

func dsOf(f func(ds *appsv1.DaemonSet) any) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any { return f(m.daemonSet(t)) }
}

func agentOf(f func(c corev1.Container) any) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any { return f(m.agent(t)) }
}

func securityOf(f func(sc *corev1.SecurityContext) any) func(t *testing.T, m *manifest) any {
	return agentOf(func(c corev1.Container) any {
		if c.SecurityContext == nil {
			return nil
		}
		return f(c.SecurityContext)
	})
}

func confOf(key string) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any { return networkConfig(t, m)[key] }
}

// mountedAt is the agent's mount path of the node's directory host, or "" when unmounted.
func mountedAt(host string) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any { return m.hostPaths(t)[host] }
}

func labelOf(kind, name, key string) func(t *testing.T, m *manifest) any {
	return func(t *testing.T, m *manifest) any {
		d := m.find(kind, name)
		if d == nil {
			return fmt.Sprintf("no %s %s", kind, name)
		}
		meta, ok := d.object.(interface{ GetLabels() map[string]string })
		if !ok {
			return fmt.Sprintf("%s %s has no labels", kind, name)
		}
		v, ok := meta.GetLabels()[key]
		if !ok {
			return nil
		}
		return v
	}
}

func secretNames(refs []corev1.LocalObjectReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

func saPullSecrets(t *testing.T, m *manifest) any {
	return secretNames(object[*corev1.ServiceAccount](t, m, "ServiceAccount", "istio-cni").ImagePullSecrets)
}

func sortedCaps(sc *corev1.SecurityContext) any {
	if sc.Capabilities == nil {
		return nil
	}
	add := slices.Clone(sc.Capabilities.Add)
	slices.Sort(add)
	return add
}

func quotaPods(t *testing.T, m *manifest) any {
	d := m.find("ResourceQuota", "istio-cni-resource-quota")
	if d == nil {
		return nil
	}
	q := d.object.(*corev1.ResourceQuota)
	pods := q.Spec.Hard[corev1.ResourcePods]
	scope := ""
	if s := q.Spec.ScopeSelector; s != nil && len(s.MatchExpressions) == 1 {
		scope = fmt.Sprint(s.MatchExpressions[0].ScopeName, " ", s.MatchExpressions[0].Operator, " ", s.MatchExpressions[0].Values)
	}
	return fmt.Sprint(pods.Value(), " pods of ", scope)
}

func resourcesOf(c corev1.Container) any {
	out := map[string]string{}
	for k, v := range c.Resources.Requests {
		out["requests."+string(k)] = v.String()
	}
	for k, v := range c.Resources.Limits {
		out["limits."+string(k)] = v.String()
	}
	return out
}

// TestIstioValuesReachTheObjects: Istio's default values file and realistic override files
// written for Istio's chart render, and each value is where Istio's chart puts it (or, for
// a setting this chart names differently, where this chart's name puts it).
func TestIstioValuesReachTheObjects(t *testing.T) {
	appVersion := chartAppVersion(t)
	defaultTolerations := []corev1.Toleration{
		{Effect: corev1.TaintEffectNoSchedule, Operator: corev1.TolerationOpExists},
		{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
		{Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists},
	}
	repairInPlaceCaps := []corev1.Capability{"DAC_OVERRIDE", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}
	cases := map[string][]placed{
		"default": {
			{"hub, tag, image, global.hub, global.tag", "install-cni image: this chart's (Istio's global hub holds Istio's agent)",
				agentOf(func(c corev1.Container) any { return c.Image }), "registry.example.com/mesh/install-cni:" + appVersion},
			{"pullPolicy, global.imagePullPolicy (both empty)", "no install-cni imagePullPolicy (Kubernetes' default, as Istio's chart leaves it)", agentOf(func(c corev1.Container) any { return string(c.ImagePullPolicy) }), ""},
			{"global.logging.level", "AGENT_LOG_LEVEL", envOf("AGENT_LOG_LEVEL"), "info"},
			{"global.logAsJson", "AGENT_LOG_AS_JSON", envOf("AGENT_LOG_AS_JSON"), "false"},
			{"cniBinDir", "host path mounted at /host/opt/cni/bin", mountedAt("/opt/cni/bin"), "/host/opt/cni/bin"},
			{"cniBinDir", "CNI_BIN_DIR", envOf("CNI_BIN_DIR"), "/opt/cni/bin"},
			{"cniConfDir", "CNI_NET_DIR", envOf("CNI_NET_DIR"), "/etc/cni/net.d"},
			{"cniConfFileName (empty)", "no CNI_CONF_NAME", envOf("CNI_CONF_NAME"), ""},
			{"cniNetnsDir", "host path mounted for the repair in place", mountedAt("/var/run/netns"), "/host/var/run/netns"},
			{"excludeNamespaces", "EXCLUDE_NAMESPACES", envOf("EXCLUDE_NAMESPACES"), "kube-system"},
			{"excludeNamespaces", "plugin config exclude_namespaces", confOf("exclude_namespaces"), []any{"kube-system"}},
			{"chained", "CHAINED_CNI_PLUGIN", envOf("CHAINED_CNI_PLUGIN"), "true"},
			{"provider: default", "no NetworkAttachmentDefinition", func(t *testing.T, m *manifest) any { return len(m.all("NetworkAttachmentDefinition")) }, 0},
			{"repair.enabled", "REPAIR_ENABLED", envOf("REPAIR_ENABLED"), "true"},
			{"repair.repairPods", "REPAIR_REPAIR_PODS", envOf("REPAIR_REPAIR_PODS"), "true"},
			{"repair.repairPods", "netns capabilities", securityOf(sortedCaps), repairInPlaceCaps},
			{"repair.deletePods", "REPAIR_DELETE_PODS", envOf("REPAIR_DELETE_PODS"), "false"},
			{"repair.labelPods", "REPAIR_LABEL_PODS", envOf("REPAIR_LABEL_PODS"), "false"},
			{"repair.initContainerName", "REPAIR_INIT_CONTAINER_NAME", envOf("REPAIR_INIT_CONTAINER_NAME"), "istio-validation"},
			{"repair.brokenPodLabelKey", "REPAIR_BROKEN_POD_LABEL_KEY", envOf("REPAIR_BROKEN_POD_LABEL_KEY"), "cni.istio.io/uninitialized"},
			{"repair.brokenPodLabelValue", "REPAIR_BROKEN_POD_LABEL_VALUE", envOf("REPAIR_BROKEN_POD_LABEL_VALUE"), "true"},
			{"seccompProfile: {} (keeps the chart's default)", "securityContext.seccompProfile", securityOf(func(sc *corev1.SecurityContext) any { return sc.SeccompProfile }),
				&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			{"seLinuxOptions: {}", "no securityContext.seLinuxOptions", securityOf(func(sc *corev1.SecurityContext) any { return sc.SELinuxOptions }), (*corev1.SELinuxOptions)(nil)},
			{"useAppArmorAnnotation without a profile", "no AppArmor annotation", dsOf(func(ds *appsv1.DaemonSet) any {
				return ds.Spec.Template.Annotations["container.apparmor.security.beta.kubernetes.io/install-cni"]
			}), ""},
			{"resources", "install-cni resources", agentOf(resourcesOf), map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
			{"resourceQuotas.enabled: false", "no ResourceQuota", quotaPods, nil},
			{"tolerations", "pod tolerations", dsOf(func(ds *appsv1.DaemonSet) any { return ds.Spec.Template.Spec.Tolerations }), defaultTolerations},
			{"updateStrategy", "DaemonSet updateStrategy", dsOf(func(ds *appsv1.DaemonSet) any {
				return fmt.Sprint(ds.Spec.UpdateStrategy.Type, " ", ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)
			}), "RollingUpdate 1"},
			{"terminationGracePeriodSeconds", "pod terminationGracePeriodSeconds", dsOf(func(ds *appsv1.DaemonSet) any { return *ds.Spec.Template.Spec.TerminationGracePeriodSeconds }), int64(30)},
			{"revision (empty)", "no istio.io/rev label", labelOf("DaemonSet", "istio-cni-node", "istio.io/rev"), nil},
			{"ownerName (empty)", "no owning-resource label", labelOf("DaemonSet", "istio-cni-node", "install.operator.istio.io/owning-resource"), nil},
			{"global.imagePullSecrets: []", "no ServiceAccount pull secrets", saPullSecrets, []string(nil)},
			{"global.nativeNftables", "plugin config native_nftables", confOf("native_nftables"), false},
			{"global.networkPolicy.enabled: false", "no NetworkPolicy", func(t *testing.T, m *manifest) any { return m.find("NetworkPolicy", "istio-cni") == nil }, true},
		},
		"nested-cni": {
			{"cni.hub, cni.tag, cni.image (win over global.hub, global.tag)", "install-cni image", agentOf(func(c corev1.Container) any { return c.Image }), "registry.example.com/mesh/install-cni:0.1.0-mesh"},
			{"cni.pullPolicy (wins over global.imagePullPolicy)", "install-cni imagePullPolicy", agentOf(func(c corev1.Container) any { return string(c.ImagePullPolicy) }), "IfNotPresent"},
			{"cni.logLevel", "PLUGIN_LOG_LEVEL", envOf("PLUGIN_LOG_LEVEL"), "info"},
			{"cni.logLevel", "plugin config plugin_log_level", confOf("plugin_log_level"), "info"},
			{"cni.logging.level (most verbose scope; wins over global.logging.level)", "AGENT_LOG_LEVEL", envOf("AGENT_LOG_LEVEL"), "debug"},
			{"global.logAsJson", "AGENT_LOG_AS_JSON", envOf("AGENT_LOG_AS_JSON"), "true"},
			{"cni.cniBinDir", "host path mounted at /host/opt/cni/bin", mountedAt("/var/lib/cni/bin"), "/host/opt/cni/bin"},
			{"cni.cniBinDir", "plugin config kubernetes.cni_bin_dir", func(t *testing.T, m *manifest) any {
				return networkConfig(t, m)["kubernetes"].(map[string]any)["cni_bin_dir"]
			}, "/var/lib/cni/bin"},
			{"cni.cniConfDir", "host path mounted at /host/etc/cni/net.d", mountedAt("/etc/cni/conf.d"), "/host/etc/cni/net.d"},
			{"cni.cniConfFileName", "CNI_CONF_NAME", envOf("CNI_CONF_NAME"), "10-flannel.conflist"},
			{"cni.cniNetnsDir (unmounted: no repair in place)", "no netns mount", mountedAt("/run/netns"), ""},
			{"cni.excludeNamespaces", "EXCLUDE_NAMESPACES", envOf("EXCLUDE_NAMESPACES"), "istio-system,kube-system,monitoring"},
			{"cni.affinity", "pod affinity", dsOf(func(ds *appsv1.DaemonSet) any {
				a := ds.Spec.Template.Spec.Affinity
				if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
					return nil
				}
				return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key
			}), "mesh.example.com/enabled"},
			{"cni.podAnnotations", "pod annotation", dsOf(func(ds *appsv1.DaemonSet) any { return ds.Spec.Template.Annotations["example.com/team"] }), "mesh"},
			{"cni.psp_cluster_role", "RoleBinding istio-cni-psp-mesh-psp", func(t *testing.T, m *manifest) any {
				rb := object[*rbacv1.RoleBinding](t, m, "RoleBinding", "istio-cni-psp-mesh-psp")
				return rb.Namespace + " " + rb.RoleRef.Kind + "/" + rb.RoleRef.Name
			}, "istio-system ClusterRole/mesh-psp"},
			{"cni.privileged: false", "securityContext.privileged", securityOf(func(sc *corev1.SecurityContext) any { return *sc.Privileged }), false},
			{"cni.repair.labelPods (deletePods and repairPods false)", "REPAIR_LABEL_PODS", envOf("REPAIR_LABEL_PODS"), "true"},
			{"cni.repair.deletePods", "REPAIR_DELETE_PODS", envOf("REPAIR_DELETE_PODS"), "false"},
			{"cni.repair.repairPods", "REPAIR_REPAIR_PODS", envOf("REPAIR_REPAIR_PODS"), "false"},
			{"cni.repair.brokenPodLabelKey", "REPAIR_BROKEN_POD_LABEL_KEY", envOf("REPAIR_BROKEN_POD_LABEL_KEY"), "mesh.example.com/broken"},
			{"cni.repair.brokenPodLabelValue", "REPAIR_BROKEN_POD_LABEL_VALUE", envOf("REPAIR_BROKEN_POD_LABEL_VALUE"), "yes"},
			{"cni.seccompProfile", "securityContext.seccompProfile", securityOf(func(sc *corev1.SecurityContext) any { return sc.SeccompProfile }),
				&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			{"cni.resources (global.defaultResources unused)", "install-cni resources", agentOf(resourcesOf),
				map[string]string{"requests.cpu": "50m", "requests.memory": "64Mi", "limits.memory": "256Mi"}},
			{"cni.resourceQuotas", "ResourceQuota istio-cni-resource-quota", quotaPods, "3000 pods of PriorityClass In [system-node-critical]"},
			{"cni.rollingMaxUnavailable", "DaemonSet updateStrategy", dsOf(func(ds *appsv1.DaemonSet) any {
				return fmt.Sprint(ds.Spec.UpdateStrategy.Type, " ", ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)
			}), "RollingUpdate 25%"},
			{"revision", "istio.io/rev label of the DaemonSet", labelOf("DaemonSet", "istio-cni-node", "istio.io/rev"), "canary"},
			{"revision", "istio.io/rev label of the ConfigMap", labelOf("ConfigMap", "istio-cni-config", "istio.io/rev"), "canary"},
			{"revision", "no istio.io/rev on the pods (injection webhooks select by it)", dsOf(func(ds *appsv1.DaemonSet) any { return ds.Spec.Template.Labels["istio.io/rev"] }), ""},
			{"ownerName", "owning-resource label", labelOf("DaemonSet", "istio-cni-node", "install.operator.istio.io/owning-resource"), "installed-state-mesh"},
			{"global.imagePullSecrets", "ServiceAccount istio-cni imagePullSecrets", saPullSecrets, []string{"mesh-pull"}},
		},
		"private-registry": {
			{"hub, tag (global.hub and global.tag name Istio's images)", "install-cni image", agentOf(func(c corev1.Container) any { return c.Image }), "registry.corp.example/mirror/istio-cni/install-cni:0.1.0"},
			{"global.imagePullPolicy", "install-cni imagePullPolicy", agentOf(func(c corev1.Container) any { return string(c.ImagePullPolicy) }), "IfNotPresent"},
			{"global.imagePullSecrets", "ServiceAccount istio-cni imagePullSecrets", saPullSecrets, []string{"corp-registry", "corp-registry-backup"}},
			{"global.imagePullSecrets", "pod imagePullSecrets", dsOf(func(ds *appsv1.DaemonSet) any { return secretNames(ds.Spec.Template.Spec.ImagePullSecrets) }),
				[]string{"corp-registry", "corp-registry-backup"}},
		},
		"openshift": {
			{"cni.cniBinDir", "host path mounted at /host/opt/cni/bin", mountedAt("/var/lib/cni/bin"), "/host/opt/cni/bin"},
			{"cni.cniConfDir", "host path mounted at /host/etc/cni/net.d", mountedAt("/etc/cni/multus/net.d"), "/host/etc/cni/net.d"},
			{"cni.chained", "CHAINED_CNI_PLUGIN", envOf("CHAINED_CNI_PLUGIN"), "false"},
			{"cni.cniConfFileName", "CNI_CONF_NAME", envOf("CNI_CONF_NAME"), "istio-cni.conf"},
			{"cni.provider: multus", "MULTUS_ENABLED", envOf("MULTUS_ENABLED"), "true"},
			{"pilot, trustedZtunnelNamespace (Istio's other charts' keys)", "nothing rendered from them", func(t *testing.T, m *manifest) any {
				return strings.Contains(string(m.raw), "pilot") || strings.Contains(string(m.raw), "ztunnel")
			}, false},
			{"cni.provider: multus", "NetworkAttachmentDefinition istio-cni in default", func(t *testing.T, m *manifest) any {
				var ns []string
				for _, d := range m.all("NetworkAttachmentDefinition") {
					ns = append(ns, d.ns+"/"+d.name)
				}
				return ns
			}, []string{"default/istio-cni"}},
			{"cni.provider: multus", "ClusterRole istio-cni: use of the privileged SecurityContextConstraints", func(t *testing.T, m *manifest) any {
				return slices.Contains(grants(t, m), "cluster security.openshift.io securitycontextconstraints privileged use")
			}, true},
			{"seLinuxOptions", "securityContext.seLinuxOptions", securityOf(func(sc *corev1.SecurityContext) any { return sc.SELinuxOptions }), &corev1.SELinuxOptions{Type: "spc_t"}},
		},
		"gke": {
			{"cni.cniBinDir: \"\" (detected: not a GKE version)", "host path mounted at /host/opt/cni/bin", mountedAt("/opt/cni/bin"), "/host/opt/cni/bin"},
			{"resourceQuotas.enabled", "ResourceQuota istio-cni-resource-quota", quotaPods, "5000 pods of PriorityClass In [system-node-critical]"},
		},
		"resources-seccomp": {
			{"resources", "install-cni resources", agentOf(resourcesOf),
				map[string]string{"requests.cpu": "20m", "requests.memory": "48Mi", "limits.cpu": "500m", "limits.memory": "128Mi"}},
			{"seccompProfile", "securityContext.seccompProfile", securityOf(func(sc *corev1.SecurityContext) any { return sc.SeccompProfile }),
				&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr("profiles/istio-cni.json")}},
			{"seLinuxOptions (type defaults to spc_t)", "securityContext.seLinuxOptions", securityOf(func(sc *corev1.SecurityContext) any { return sc.SELinuxOptions }),
				&corev1.SELinuxOptions{Type: "spc_t", Level: "s0:c123,c456"}},
			{"terminationGracePeriodSeconds", "pod terminationGracePeriodSeconds", dsOf(func(ds *appsv1.DaemonSet) any { return *ds.Spec.Template.Spec.TerminationGracePeriodSeconds }), int64(10)},
			{"updateStrategy", "DaemonSet updateStrategy", dsOf(func(ds *appsv1.DaemonSet) any {
				return fmt.Sprint(ds.Spec.UpdateStrategy.Type, " ", ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)
			}), "RollingUpdate 20%"},
			{"daemonSetLabels", "DaemonSet label", labelOf("DaemonSet", "istio-cni-node", "example.com/component"), "mesh-node"},
			{"daemonSetLabels", "not on the pods", dsOf(func(ds *appsv1.DaemonSet) any { return ds.Spec.Template.Labels["example.com/component"] }), ""},
			{"podLabels", "pod label", dsOf(func(ds *appsv1.DaemonSet) any { return ds.Spec.Template.Labels["example.com/cost-center"] }), "1234"},
			{"env (text)", "GODEBUG", envOf("GODEBUG"), "madvdontneed=1"},
			{"env (number)", "MESH_FEATURE_COUNT", envOf("MESH_FEATURE_COUNT"), "3"},
			{"env (boolean)", "MESH_FEATURE_ON", envOf("MESH_FEATURE_ON"), "true"},
			{"global.logging.level", "AGENT_LOG_LEVEL", envOf("AGENT_LOG_LEVEL"), "warn"},
			{"global.logAsJson", "AGENT_LOG_AS_JSON", envOf("AGENT_LOG_AS_JSON"), "true"},
			{"global.nativeNftables", "NATIVE_NFTABLES", envOf("NATIVE_NFTABLES"), "true"},
			{"global.nativeNftables", "plugin config native_nftables", confOf("native_nftables"), true},
			{"global.networkPolicy.enabled", "NetworkPolicy istio-cni: the agent's ports", func(t *testing.T, m *manifest) any {
				np := object[*networkingv1.NetworkPolicy](t, m, "NetworkPolicy", "istio-cni")
				var ports []string
				for _, r := range np.Spec.Ingress {
					for _, p := range r.Ports {
						ports = append(ports, p.Port.String())
					}
				}
				return strings.Join(ports, ",") + " " + np.Spec.PodSelector.MatchLabels["k8s-app"]
			}, "15014,8000 istio-cni-node"},
		},
		"repair": {
			{"repair.repairPods: false", "REPAIR_REPAIR_PODS", envOf("REPAIR_REPAIR_PODS"), "false"},
			{"repair.repairPods: false", "no netns capabilities", securityOf(sortedCaps), []corev1.Capability{"DAC_OVERRIDE"}},
			{"repair.deletePods", "REPAIR_DELETE_PODS", envOf("REPAIR_DELETE_PODS"), "false"},
			{"repair.labelPods", "REPAIR_LABEL_PODS", envOf("REPAIR_LABEL_PODS"), "true"},
			{"repair.labelPods", "ClusterRole istio-cni: patch pods/status, no pod delete", func(t *testing.T, m *manifest) any {
				g := grants(t, m)
				return fmt.Sprint(slices.Contains(g, "cluster  pods/status * patch"), slices.Contains(g, "cluster  pods * delete"))
			}, "true false"},
			{"repair.initContainerName", "REPAIR_INIT_CONTAINER_NAME", envOf("REPAIR_INIT_CONTAINER_NAME"), "mesh-validation"},
			{"repair.brokenPodLabelKey", "REPAIR_BROKEN_POD_LABEL_KEY", envOf("REPAIR_BROKEN_POD_LABEL_KEY"), "mesh.example.com/cni-broken"},
			{"repair.brokenPodLabelValue", "REPAIR_BROKEN_POD_LABEL_VALUE", envOf("REPAIR_BROKEN_POD_LABEL_VALUE"), "1"},
		},
	}
	for _, file := range istioFiles {
		checks, ok := cases[file]
		if !ok {
			t.Errorf("testdata/istio/%s.yaml has no checks", file)
			continue
		}
		t.Run(file, func(t *testing.T) {
			m := mustRender(t, istioArgs(file)...)
			for _, c := range checks {
				if diff := cmp.Diff(c.want, c.got(t, m)); diff != "" {
					t.Errorf("%s -> %s (-want +got):\n%s", c.value, c.where, diff)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestIstioValuesOfMissingFeaturesAreRefused: an Istio value for a feature this istio-cni
// does not have fails the install with a message naming it, in either form.
func TestIstioValuesOfMissingFeaturesAreRefused(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string // substrings of the error
	}{
		{"ambient under cni", []string{"--set", "cni.ambient.enabled=true"}, []string{"ambient.enabled is true", "no ambient mode"}},
		{"ambient profile", []string{"--set", "profile=ambient"}, []string{"profile is ambient", "no ambient mode"}},
		{"ambient profile in global", []string{"--set", "global.profile=ambient"}, []string{"global.profile is ambient"}},
		{"unknown provider", []string{"--set", "cni.provider=ambient"}, []string{"/cni/provider", "'ambient'"}},
		{"image variant", []string{"--set", "variant=distroless"}, []string{`variant "distroless"`, "one variant"}},
		{"image variant under cni", []string{"--set", "cni.variant=debug"}, []string{`variant "debug"`}},
		{"istio-owned config", []string{"--set", "istioOwnedCNIConfig=true"}, []string{"istioOwnedCNIConfig is true"}},
		{"resource scope", []string{"--set", "global.resourceScope=cluster"}, []string{`global.resourceScope is "cluster"`}},
		{"cni disabled", []string{"--set", "cni.enabled=false"}, []string{"cni.enabled is false"}},
		{"istio's internal defaults block", []string{"--set", "_internal_defaults_do_not_set.hub=x"}, []string{"_internal_defaults_do_not_set", "top level"}},
		{"rolling update with OnDelete", []string{"--set", "rollingMaxUnavailable=2", "--set", "updateStrategy.type=OnDelete", "--set", "updateStrategy.rollingUpdate=null"},
			[]string{"rollingMaxUnavailable 2", "OnDelete"}},
		{"repair image other than the agent's", []string{"--set", "cni.repair.image=other"}, []string{"repair.image", `"other"`}},
		{"unknown istio log level", []string{"--set", "logging.level=default:trace"}, []string{"/logging/level", "'default:trace'"}},
		{"kubeconfig mode without its leading 0", []string{"--set-string", "kubeconfigMode=600"}, []string{"/kubeconfigMode", "'600'"}},
		{"extra bypass uid 0", []string{"--set-json", "extraBypassUIDs=[0]"}, []string{"/extraBypassUIDs/0", "minimum"}},
		{"unknown key under cni", []string{"--set", "cni.cniBinDirs=/opt/cni/bin"}, []string{"/cni", "'cniBinDirs'"}},
		{"bad type under global", []string{"--set-string", "global.logAsJson=yes"}, []string{"/global/logAsJson", "want boolean"}},
		{"misspelt key under global.logging", []string{"--set", "global.logging.levle=debug"}, []string{"/global/logging", "'levle'"}},
		{"misspelt key under global.networkPolicy", []string{"--set", "global.networkPolicy.enable=true"}, []string{"/global/networkPolicy", "'enable'"}},
		{"global key missing a letter", []string{"--set", "global.imagePullPolcy=IfNotPresent"}, []string{"global.imagePullPolcy", "did you mean global.imagePullPolicy"}},
		{"global key in another case", []string{"--set", "global.ImagePullPolicy=IfNotPresent"}, []string{"global.ImagePullPolicy", "did you mean global.imagePullPolicy"}},
		{"global key with two letters swapped", []string{"--set", "global.nativeNftbales=true"}, []string{"global.nativeNftbales", "did you mean global.nativeNftables"}},
		{"global key with a letter changed", []string{"--set", "global.defaultResourses.requests.cpu=5m"}, []string{"global.defaultResourses", "did you mean global.defaultResources"}},
		{"global key with a letter added", []string{"--set", "global.loggings.level=debug"}, []string{"global.loggings", "did you mean global.logging"}},
		{"short global key in another case", []string{"--set", "global.Hub=registry.example.com/istio"}, []string{"global.Hub", "did you mean global.hub"}},
		{"unknown compatibility version", []string{"--set", "compatibilityVersion=1.24"}, []string{"/compatibilityVersion", "1.25", "1.30"}},
		{"compatibility version of a future Istio", []string{"--set", "compatibilityVersion=1.31"}, []string{"/compatibilityVersion"}},
		{"relative netns dir under cni", []string{"--set", "cni.cniNetnsDir=run/netns"}, []string{"/cni/cniNetnsDir", "'run/netns'"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, c.want) })
	}
}

// TestIstioNamesAndThisChartsNames: where a setting has two names, the one the README
// says wins does.
func TestIstioNamesAndThisChartsNames(t *testing.T) {
	image := agentOf(func(c corev1.Container) any { return c.Image })
	pull := agentOf(func(c corev1.Container) any { return string(c.ImagePullPolicy) })
	cases := []struct {
		name string
		args []string
		got  func(t *testing.T, m *manifest) any
		want any
	}{
		{"cni.hub over hub", []string{"--set", "hub=a.example/x", "--set", "cni.hub=b.example/y", "--set", "tag=1"}, image, "b.example/y/install-cni:1"},
		{"empty cni.hub keeps hub", []string{"--set", "hub=a.example/x", "--set", "cni.hub=", "--set", "tag=1"}, image, "a.example/x/install-cni:1"},
		{"cni.chained=false over chained", []string{"--set", "cni.chained=false"}, envOf("CHAINED_CNI_PLUGIN"), "false"},
		{"Istio's whole image reference", []string{"--set", "image=registry.example.com/mesh/install-cni:2.0"}, image, "registry.example.com/mesh/install-cni:2.0"},
		{"Istio's image reference by digest", []string{"--set", "image=registry.example.com/mesh/install-cni@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}, image,
			"registry.example.com/mesh/install-cni@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"a path under hub stays one", []string{"--set", "hub=a.example", "--set", "image=mesh/install-cni", "--set", "tag=1"}, image, "a.example/mesh/install-cni:1"},
		{"pullPolicy over global.imagePullPolicy", []string{"--set", "pullPolicy=Never", "--set", "global.imagePullPolicy=IfNotPresent"}, pull, "Never"},
		{"global.imagePullPolicy when pullPolicy is empty", []string{"--set", "global.imagePullPolicy=IfNotPresent"}, pull, "IfNotPresent"},
		{"agentLogLevel over logging.level", []string{"--set", "agentLogLevel=error", "--set", "logging.level=debug"}, envOf("AGENT_LOG_LEVEL"), "error"},
		{"logging.level over global.logging.level", []string{"--set", "logging.level=warn", "--set", "global.logging.level=debug"}, envOf("AGENT_LOG_LEVEL"), "warn"},
		{"Istio's fatal is error", []string{"--set", "logging.level=fatal"}, envOf("AGENT_LOG_LEVEL"), "error"},
		{"the cni-plugin scope is the plugin's level", []string{"--set", "logging.level=default:warn\\,cni-plugin:debug"}, envOf("PLUGIN_LOG_LEVEL"), "debug"},
		{"the cni-plugin scope is in the plugin's config", []string{"--set", "logging.level=default:warn\\,cni-plugin:debug"}, confOf("plugin_log_level"), "debug"},
		{"the cni-plugin scope does not set the agent's", []string{"--set", "logging.level=default:warn\\,cni-plugin:debug"}, envOf("AGENT_LOG_LEVEL"), "warn"},
		{"the cni-plugin scope alone leaves the agent at info", []string{"--set", "global.logging.level=cni-plugin:error"}, envOf("AGENT_LOG_LEVEL"), "info"},
		{"the all scope sets the plugin's too", []string{"--set", "logging.level=all:error"}, envOf("PLUGIN_LOG_LEVEL"), "error"},
		{"the cni-plugin scope wins over logLevel", []string{"--set", "logLevel=warn", "--set", "logging.level=cni-plugin:info"}, envOf("PLUGIN_LOG_LEVEL"), "info"},
		{"no plugin scope keeps logLevel", []string{"--set", "logLevel=error", "--set", "logging.level=debug"}, envOf("PLUGIN_LOG_LEVEL"), "error"},
		{"rollingMaxUnavailable over updateStrategy", []string{"--set", "rollingMaxUnavailable=3"}, dsOf(func(ds *appsv1.DaemonSet) any {
			return ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String()
		}), "3"},
		{"global.defaultResources when resources is empty", []string{"--set", "resources=null", "--set", "global.defaultResources.requests.cpu=5m"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "5m"}},
		{"empty cniConfDir is the default", []string{"--set", "cniConfDir="}, envOf("CNI_NET_DIR"), "/etc/cni/net.d"},
		{"profile demo lowers the default requests", []string{"--set", "profile=demo"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "10m", "requests.memory": "40Mi"}},
		{"global.profile demo too", []string{"--set", "global.profile=demo"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "10m", "requests.memory": "40Mi"}},
		{"profile demo under cni", []string{"--set", "cni.profile=demo"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "10m", "requests.memory": "40Mi"}},
		{"profile demo over global.defaultResources", []string{"--set", "profile=demo", "--set", "resources=null", "--set", "global.defaultResources.requests.cpu=5m"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "10m", "requests.memory": "40Mi"}},
		{"resources set win over profile demo", []string{"--set", "profile=demo", "--set", "resources.requests.cpu=50m", "--set", "resources.limits.memory=256Mi"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "50m", "requests.memory": "100Mi", "limits.memory": "256Mi"}},
		{"profile over global.profile (default over demo)", []string{"--set", "profile=default", "--set", "global.profile=demo"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
		{"a compatibility version Istio knows changes nothing here", []string{"--set", "compatibilityVersion=1.28"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
		// Istio 1.30's chart knows 1.29, Istio 1.31's 1.30: values files of those releases
		// set them (and a YAML 1.30 unquoted is the number 1.3).
		{"Istio 1.30's compatibility version", []string{"--set", "compatibilityVersion=1.29"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
		{"Istio 1.31's compatibility version", []string{"--set", "compatibilityVersion=1.30"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
		{"Istio 1.31's compatibility version as a YAML number", []string{"--set-json", "compatibilityVersion=1.30"}, agentOf(resourcesOf),
			map[string]string{"requests.cpu": "100m", "requests.memory": "100Mi"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, c.args...)
			if diff := cmp.Diff(c.want, c.got(t, m)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestEmptyBinDirIsOptCNIBinOffGKE: Istio's empty cniBinDir means /opt/cni/bin on a
// cluster whose Kubernetes version does not name GKE. (The GKE branch, /home/kubernetes/bin
// for a version like v1.37.2-gke.1200, cannot be rendered offline: helm template's
// --kube-version drops the suffix; helm install passes the server's full version.)
func TestEmptyBinDirIsOptCNIBinOffGKE(t *testing.T) {
	for _, args := range [][]string{istioArgs("gke"), {"--set", "cniBinDir="}, {}} {
		m := mustRender(t, args...)
		if got := m.env(t)["CNI_BIN_DIR"]; got != "/opt/cni/bin" {
			t.Errorf("%v: CNI_BIN_DIR %q, want /opt/cni/bin", args, got)
		}
		if got := m.hostPaths(t)["/opt/cni/bin"]; got != "/host/opt/cni/bin" {
			t.Errorf("%v: /opt/cni/bin mounted at %q, want /host/opt/cni/bin", args, got)
		}
	}
}

// TestResourceQuotaIsRefusedInKubeSystem: a ResourceQuota on pods of a priority class
// counts every pod of its namespace of that class. In kube-system, where this chart is
// installed, system-node-critical is also the class of kube-proxy and of the network
// plugin's and the platform's own node agents (GKE runs several per node there), so
// Istio's GKE values (resourceQuotas.enabled, meant for Istio's istio-system) would cap
// all of them at resourceQuotas.pods: past it (about 700 nodes of a GKE cluster) a new
// node's network agent is refused; kube-system needs no quota (GKE admits the class there).
// The chart refuses the quota there, saying how to turn it off, and renders it outside.
func TestResourceQuotaIsRefusedInKubeSystem(t *testing.T) {
	for _, args := range [][]string{
		{"-f", istioFile("gke")},
		{"--set", "resourceQuotas.enabled=true"},
		{"--set", "cni.resourceQuotas.enabled=true"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			wantRefused(t, args, []string{"resourceQuotas.enabled is true", "kube-system", "system-node-critical", "kube-proxy",
				"resourceQuotas.pods (5000)", "cni.resourceQuotas.enabled=false"})
		})
	}
	// What the message says to do works with Istio's GKE values, which set it both ways.
	if q := quotaPods(t, mustRender(t, "-f", istioFile("gke"), "--set", "cni.resourceQuotas.enabled=false")); q != nil {
		t.Errorf("with cni.resourceQuotas.enabled=false: ResourceQuota %v, want none", q)
	}
	m := mustRender(t, istioArgs("gke")...)
	if d := m.find("ResourceQuota", "istio-cni-resource-quota"); d == nil || d.ns != "istio-system" {
		t.Errorf("Istio's GKE values in istio-system: ResourceQuota %v, want one in istio-system", d)
	}
}

// TestNotesSayWhyIstiosGlobalImageIsNotUsed: global.hub and global.tag name Istio's own
// install-cni; the install notes name them and the image used instead.
func TestNotesSayWhyIstiosGlobalImageIsNotUsed(t *testing.T) {
	notes := renderNotes(t, "-f", istioFile("default"))
	for _, w := range []string{"registry.istio.io/testing", "latest", "registry.example.com/mesh/install-cni:", "Set hub and tag"} {
		if !strings.Contains(notes, w) {
			t.Errorf("notes do not name %q:\n%s", w, notes)
		}
	}
	if notes := renderNotes(t); strings.Contains(notes, "global.hub") {
		t.Errorf("notes speak of global.hub without it set:\n%s", notes)
	}
}

// TestHardenedSecurityContext: the agent's container is hardened by default (seccomp
// RuntimeDefault, read-only root filesystem, no privilege escalation) and the AppArmor,
// SELinux and seccomp values reach it.
func TestHardenedSecurityContext(t *testing.T) {
	seccomp := securityOf(func(sc *corev1.SecurityContext) any { return sc.SeccompProfile })
	readOnly := securityOf(func(sc *corev1.SecurityContext) any { return *sc.ReadOnlyRootFilesystem })
	noEscalation := securityOf(func(sc *corev1.SecurityContext) any {
		return sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	})
	appArmor := securityOf(func(sc *corev1.SecurityContext) any { return sc.AppArmorProfile })
	annotation := dsOf(func(ds *appsv1.DaemonSet) any {
		return ds.Spec.Template.Annotations["container.apparmor.security.beta.kubernetes.io/install-cni"]
	})
	cases := []struct {
		name string
		args []string
		got  func(t *testing.T, m *manifest) any
		want any
	}{
		{"seccomp RuntimeDefault by default", nil, seccomp, &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		{"seccomp off on request", []string{"--set", "seccompProfile.type=Unconfined"}, seccomp, &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}},
		{"read-only root filesystem by default", nil, readOnly, true},
		{"read-only root filesystem with troubleshooting", []string{"--set", "troubleshooting.enabled=true"}, readOnly, true},
		{"writable root filesystem on request", []string{"--set", "readOnlyRootFilesystem=false"}, readOnly, false},
		{"no privilege escalation by default", nil, noEscalation, true},
		{"no AppArmor profile by default", nil, appArmor, (*corev1.AppArmorProfile)(nil)},
		{"AppArmor profile as the field", []string{"--set", "appArmorProfile.type=RuntimeDefault"}, appArmor, &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeRuntimeDefault}},
		{"AppArmor profile as the annotation", []string{"--set", "appArmorProfile.type=Localhost", "--set", "appArmorProfile.localhostProfile=istio-cni", "--set", "useAppArmorAnnotation=true"},
			annotation, "localhost/istio-cni"},
		{"AppArmor annotation instead of the field", []string{"--set", "appArmorProfile.type=Unconfined", "--set", "useAppArmorAnnotation=true"}, appArmor, (*corev1.AppArmorProfile)(nil)},
		{"SELinux type as given", []string{"--set", "seLinuxOptions.type=container_t", "--set", "seLinuxOptions.level=s0"},
			securityOf(func(sc *corev1.SecurityContext) any { return sc.SELinuxOptions }), &corev1.SELinuxOptions{Type: "container_t", Level: "s0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, c.args...)
			if diff := cmp.Diff(c.want, c.got(t, m)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			checkSecurityContextRules(t, m)
		})
	}
}

// TestOtherChartsGlobalsPass: global is shared with a parent chart; the global keys of
// Istio's other charts (istiod, gateways, ztunnel, base), which an umbrella values file
// carries, are not taken for slips of the keys this chart reads; nor are keys one letter
// from a short one (hubs, tags), which are too often another chart's own.
func TestOtherChartsGlobalsPass(t *testing.T) {
	global := map[string]any{}
	for _, k := range []string{"arch", "caAddress", "caName", "certSigners", "configCluster", "configValidation",
		"defaultNodeSelector", "defaultPodDisruptionBudget", "defaultTolerations", "externalIstiod", "istioNamespace",
		"istiod", "meshID", "meshNetworks", "mountMtlsCerts", "multiCluster", "network", "omitSidecarInjectorConfigMap",
		"operatorManageWebhooks", "pilotCertProvider", "priorityClassName", "proxy", "proxy_init", "remotePilotAddress",
		"sds", "sts", "waypoint", "hubs", "tags", "images"} {
		global[k] = map[string]any{}
	}
	mustRender(t, valuesFile(t, map[string]any{"global": global})...)
}
