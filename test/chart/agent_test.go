package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/istio-cni/istio-cni/internal/agent"
	"github.com/istio-cni/istio-cni/internal/iptables"
	"github.com/istio-cni/istio-cni/internal/plugin"
)

var envRef = regexp.MustCompile(`\$\([A-Za-z_][A-Za-z0-9_]*\)`)

// podEnv resolves the agent's environment as the kubelet would for a pod of the
// DaemonSet on node: literal values, the downward API and the ConfigMap, plus the
// service variables Kubernetes gives every pod.
func podEnv(t *testing.T, m *manifest, podName, node string) map[string]string {
	t.Helper()
	ds := m.daemonSet(t)
	cm := m.configMap(t)
	env := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
	for _, e := range m.agent(t).Env {
		switch {
		case e.ValueFrom == nil:
			// $(NAME) of an earlier variable is expanded, as the kubelet does.
			env[e.Name] = envRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
				if v, ok := env[ref[2:len(ref)-1]]; ok {
					return v
				}
				return ref
			})
		case e.ValueFrom.ConfigMapKeyRef != nil:
			env[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				env[e.Name] = ds.Namespace
			case "metadata.name":
				env[e.Name] = podName
			case "spec.nodeName":
				env[e.Name] = node
			case "status.hostIP":
				env[e.Name] = "192.0.2.10"
			default:
				t.Fatalf("env %s: the test does not resolve field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
	}
	return env
}

// TestTheAgentAcceptsTheRenderedEnvironment: for every validated render, the agent's own
// settings parser accepts what the DaemonSet gives it (a value the agent refuses would
// be a crash-looping DaemonSet, found only on a cluster), the entry it builds from the
// ConfigMap is valid, and the controllers' settings match the chart's other objects: the
// repair and cache watch the pod's own node, the taint controller finds the agent pods by
// the DaemonSet's labels, elects through the Lease the Role grants, and taints only the
// nodes the DaemonSet runs on.
func TestTheAgentAcceptsTheRenderedEnvironment(t *testing.T) {
	all := append(slices.Clone(variants),
		struct {
			name string
			args []string
		}{"node readiness", []string{"--set", "taint.enabled=true"}},
		struct {
			name string
			args []string
		}{"no API server features", []string{"--set", "taint.enabled=false", "--set", "repair.enabled=false", "--set", "podCache.enabled=false"}},
		struct {
			name string
			args []string
		}{"openshift with the chart's namespaces only", []string{"-f", profileFile("openshift"), "--set", "multus.meshedNamespaces=false"}},
	)
	const podName, node = "istio-cni-node-x7k2p", "worker-1"
	for _, v := range all {
		t.Run(v.name, func(t *testing.T) {
			m := mustRender(t, v.args...)
			env := podEnv(t, m, podName, node)
			s, err := agent.Parse(nil, func(k string) (string, bool) { val, ok := env[k]; return val, ok })
			if err != nil {
				t.Fatalf("the agent refuses the rendered environment: %v", err)
			}
			if _, err := agent.Entry(&s, s.NetworkConfig); err != nil {
				t.Errorf("the agent refuses the ConfigMap's entry: %v", err)
			}
			if (s.PodCache || s.Repair.Enabled) && s.NodeName != node {
				t.Errorf("node name %q, want the pod's node %q", s.NodeName, node)
			}
			if s.Repair.Enabled && s.Repair.NodeName != node {
				t.Errorf("repair watches node %q, want %q", s.Repair.NodeName, node)
			}
			checkMultusSettings(t, m, s, podName)
			checkNodeView(t, m, s)
			if got := s.MonitoringAddress.String(); strings.Contains(strings.Join(v.args, " "), "monitoringBindAddress=hostIP") && got != "192.0.2.10" {
				t.Errorf("MONITORING_ADDRESS resolves to %s, want the node's address 192.0.2.10", got)
			}
			if !s.Taint.Enabled {
				return
			}
			ds := m.daemonSet(t)
			if s.Taint.Identity != podName || s.Taint.AgentNamespace != ds.Namespace {
				t.Errorf("taint identity %q in namespace %q, want the pod %q in %q", s.Taint.Identity, s.Taint.AgentNamespace, podName, ds.Namespace)
			}
			sel, err := labels.Parse(s.Taint.AgentSelector)
			if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
				t.Errorf("agent selector %q (%v) does not match the agent pods' labels %v", s.Taint.AgentSelector, err, ds.Spec.Template.Labels)
			}
			nodeSel, err := labels.Parse(s.Taint.NodeSelector)
			if err != nil || !nodeSel.Matches(labels.Set(ds.Spec.Template.Spec.NodeSelector)) {
				t.Errorf("taint node selector %q (%v) does not match the nodes the DaemonSet selects %v", s.Taint.NodeSelector, err, ds.Spec.Template.Spec.NodeSelector)
			}
			if !roleGrantsLease(t, m, s.Taint.LeaseName) {
				t.Errorf("the Role istio-cni-taint does not grant get and update of the Lease %q", s.Taint.LeaseName)
			}
		})
	}
}

// renderedPluginConfig is the plugin's config as the agent of a pod of the rendered
// DaemonSet installs it: the entry it builds from its environment, as the plugin parses it.
func renderedPluginConfig(t *testing.T, m *manifest) *plugin.Config {
	t.Helper()
	env := podEnv(t, m, "istio-cni-node-x7k2p", "worker-1")
	s, err := agent.Parse(nil, func(k string) (string, bool) { val, ok := env[k]; return val, ok })
	if err != nil {
		t.Fatalf("the agent refuses the rendered environment: %v", err)
	}
	entry, err := agent.Entry(&s, s.NetworkConfig)
	if err != nil {
		t.Fatalf("the agent refuses the ConfigMap's entry: %v", err)
	}
	conf, err := plugin.ParseConfig(entry)
	if err != nil {
		t.Fatalf("the plugin refuses the installed entry: %v\n%s", err, entry)
	}
	return conf
}

// TestJSONLogsReachThePluginsEntry: agentLogAsJson, and Istio's global.logAsJson mapped to
// it, make the plugin's own log (its stderr, the runtime's journal) JSON too, as the chart
// README says: the entry the agent installs carries log_as_json.
func TestJSONLogsReachThePluginsEntry(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"default", nil, false},
		{"agentLogAsJson", []string{"--set", "agentLogAsJson=true"}, true},
		{"Istio's global.logAsJson", []string{"--set", "global.logAsJson=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renderedPluginConfig(t, mustRender(t, tc.args...)).LogJSON; got != tc.want {
				t.Errorf("the plugin's log_as_json is %v, want %v", got, tc.want)
			}
		})
	}
}

// checkNodeView: what the agent's node check reads of the node is where the
// chart mounts it. The node's /proc, when mounted, at the agent's
// Repair.ProcDir; else in iptables mode, unless nodeCheck.mountToolDirs is
// false, each of the node's iptables.NodePathDirs read-only at NodeDirsRoot +
// the dir, which plugin.NodeViewIn turns into the view the check looks in.
func checkNodeView(t *testing.T, m *manifest, s agent.Settings) {
	t.Helper()
	mounts := m.hostPaths(t)
	proc, hasProc := mounts["/proc"]
	if hasProc && proc != s.Repair.ProcDir {
		t.Errorf("the node's /proc is mounted at %s, but the agent reads it at %s", proc, s.Repair.ProcDir)
	}
	var dirs []string
	for _, d := range iptables.NodePathDirs {
		if mp, ok := mounts[d]; ok {
			dirs = append(dirs, d)
			if want := filepath.Join(s.NodeDirsRoot, d); mp != want {
				t.Errorf("the node's %s is mounted at %s, but the agent looks at %s", d, mp, want)
			}
		}
	}
	if hasProc || s.NativeNftables {
		if len(dirs) > 0 {
			t.Errorf("the node's %v mounted beside its /proc or in nftables mode: the node check needs neither", dirs)
		}
		return
	}
	if len(dirs) > 0 && len(dirs) != len(iptables.NodePathDirs) {
		t.Errorf("the node's %v mounted, want all of %v or none", dirs, iptables.NodePathDirs)
	}
}

// checkMultusSettings: Multus mode follows multus.enabled, and repair knows it; the
// agent keeps the objects in the namespaces the chart leaves out, names this pod in the
// Lease the Role istio-cni-multus grants, and makes the chart's own ClusterRole their owner.
func checkMultusSettings(t *testing.T, m *manifest, s agent.Settings, podName string) {
	t.Helper()
	nads := m.all("NetworkAttachmentDefinition")
	if s.Multus.Enabled != (len(nads) > 0 || s.Multus.MeshedNamespaces) {
		t.Errorf("MULTUS_ENABLED=%v, with %d NetworkAttachmentDefinitions rendered and the agent's controller %v", s.Multus.Enabled, len(nads), s.Multus.MeshedNamespaces)
	}
	if want := map[bool]string{true: s.Multus.Network}[s.Multus.Enabled]; s.Repair.Enabled && s.Repair.MultusNetwork != want {
		t.Errorf("repair's Multus network %q, want %q", s.Repair.MultusNetwork, want)
	}
	for _, d := range nads {
		if d.name != s.Multus.Network {
			t.Errorf("%s: the agent's network is %q", d, s.Multus.Network)
		}
	}
	if !s.Multus.MeshedNamespaces {
		return
	}
	var chartNS []string
	for _, d := range nads {
		chartNS = append(chartNS, d.ns)
	}
	if !slices.Equal(chartNS, s.Multus.StaticNamespaces) {
		t.Errorf("the agent leaves %v to helm, but the chart creates the object in %v", s.Multus.StaticNamespaces, chartNS)
	}
	ds := m.daemonSet(t)
	if s.Multus.Identity != podName || s.Multus.LeaseNamespace != ds.Namespace {
		t.Errorf("multus identity %q in namespace %q, want the pod %q in %q", s.Multus.Identity, s.Multus.LeaseNamespace, podName, ds.Namespace)
	}
	if !roleGrantsLeaseIn(t, m, "istio-cni-multus", s.Multus.LeaseName) {
		t.Errorf("the Role istio-cni-multus does not grant get and update of the Lease %q", s.Multus.LeaseName)
	}
	if m.find("ClusterRole", s.Multus.OwnerClusterRole) == nil {
		t.Errorf("the owner ClusterRole %q is not the chart's", s.Multus.OwnerClusterRole)
	}
}

func roleGrantsLease(t *testing.T, m *manifest, lease string) bool {
	t.Helper()
	return roleGrantsLeaseIn(t, m, "istio-cni-taint", lease)
}

func roleGrantsLeaseIn(t *testing.T, m *manifest, role, lease string) bool {
	t.Helper()
	d := m.find("Role", role)
	if d == nil {
		return false
	}
	verbs := map[string]bool{}
	for _, r := range d.object.(*rbacv1.Role).Rules {
		if slices.Contains(r.APIGroups, "coordination.k8s.io") && slices.Contains(r.Resources, "leases") &&
			(len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, lease)) {
			for _, v := range r.Verbs {
				verbs[v] = true
			}
		}
	}
	return verbs["get"] && verbs["update"] && verbs["create"]
}

// TestTheGracePeriodCoversTheAgentsExit: between SIGTERM and removing the files of a
// removal the agent waits at most agent.ExitBound (the exit decision's requests
// while the features stop, then the readiness taint's removal); the DaemonSet's
// terminationGracePeriodSeconds leaves at least 1 s more for the files, or the
// kubelet could kill the agent in the middle of an uninstall.
func TestTheGracePeriodCoversTheAgentsExit(t *testing.T) {
	ds := mustRender(t).daemonSet(t)
	grace := time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace < agent.ExitBound+time.Second {
		t.Errorf("terminationGracePeriodSeconds %s, want at least agent.ExitBound (%s) + 1s", grace, agent.ExitBound)
	}
	// A lower value is refused at install: the schema's minimum is the same bound.
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Grace struct {
				Minimum *float64 `json:"minimum"`
			} `json:"terminationGracePeriodSeconds"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	want := (agent.ExitBound + time.Second).Seconds()
	switch m := schema.Properties.Grace.Minimum; {
	case m == nil:
		t.Errorf("values.schema.json: terminationGracePeriodSeconds has no minimum, want %v (agent.ExitBound %s + 1s)", want, agent.ExitBound)
	case *m != want:
		t.Errorf("values.schema.json: terminationGracePeriodSeconds minimum %v, want %v (agent.ExitBound %s + 1s)", *m, want, agent.ExitBound)
	}
}
