package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// scrapeObject is the part of a ServiceMonitor or PodMonitor this test reads (the
// CRD's schema itself is checked by TestEveryObjectValidatesOffline).
type scrapeObject struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
		PodMetricsEndpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

func scrapeObjectOf(t *testing.T, m *manifest, kind string) scrapeObject {
	t.Helper()
	d := m.find(kind, "istio-cni-node")
	if d == nil {
		t.Fatalf("no %s istio-cni-node", kind)
	}
	var o scrapeObject
	if err := yaml.Unmarshal(d.raw, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestMonitorsScrapeTheAgentsMetricsPort: the ServiceMonitor reaches the agent pods
// through the Service (its selector matches the Service, the Service's matches the
// pods, the port names the container's metrics port), the PodMonitor selects the
// pods directly, and the dashboard ConfigMap holds the chart's dashboard file.
func TestMonitorsScrapeTheAgentsMetricsPort(t *testing.T) {
	m := mustRender(t, "--namespace", "istio-system",
		"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.serviceMonitor.interval=30s",
		"--set", "monitoring.serviceMonitor.labels.release=prom",
		"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.scrapeTimeout=5s",
		"--set", "dashboard.enabled=true", "--set", "monitoringPort=15020")
	ds := m.daemonSet(t)
	podLabels := labels.Set(ds.Spec.Template.Labels)
	var metricsPort *corev1.ContainerPort
	for _, p := range m.agent(t).Ports {
		if p.Name == "metrics" {
			metricsPort = &p
		}
	}
	if metricsPort == nil || metricsPort.ContainerPort != 15020 {
		t.Fatalf("agent's metrics port %+v, want one named metrics on 15020", metricsPort)
	}

	svc := object[*corev1.Service](t, m, "Service", "istio-cni-metrics")
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Service's selector %v does not match the agent pods %v", svc.Spec.Selector, podLabels)
	}
	if svc.Spec.ClusterIP != "None" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" ||
		svc.Spec.Ports[0].TargetPort.String() != "metrics" || svc.Spec.Ports[0].Port != 15020 {
		t.Errorf("Service %+v, want headless with port metrics -> the container's metrics port", svc.Spec)
	}

	sm := scrapeObjectOf(t, m, "ServiceMonitor")
	if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(svc.Labels)) {
		t.Errorf("the ServiceMonitor's selector %v does not match the Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" ||
		sm.Spec.Endpoints[0].Interval != "30s" || sm.Spec.Endpoints[0].ScrapeTimeout != "" {
		t.Errorf("ServiceMonitor endpoints %+v", sm.Spec.Endpoints)
	}
	if sm.Metadata.Labels["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v, want release=prom added", sm.Metadata.Labels)
	}

	pm := scrapeObjectOf(t, m, "PodMonitor")
	if !labels.SelectorFromSet(pm.Spec.Selector.MatchLabels).Matches(podLabels) {
		t.Errorf("the PodMonitor's selector %v does not match the agent pods %v", pm.Spec.Selector.MatchLabels, podLabels)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port != "metrics" || pm.Spec.PodMetricsEndpoints[0].ScrapeTimeout != "5s" {
		t.Errorf("PodMonitor endpoints %+v", pm.Spec.PodMetricsEndpoints)
	}
	for kind, o := range map[string]scrapeObject{"ServiceMonitor": sm, "PodMonitor": pm} {
		if len(o.Spec.NamespaceSelector.MatchNames) != 1 || o.Spec.NamespaceSelector.MatchNames[0] != "istio-system" {
			t.Errorf("%s looks in namespaces %v, want the release's", kind, o.Spec.NamespaceSelector.MatchNames)
		}
	}

	cm := object[*corev1.ConfigMap](t, m, "ConfigMap", "istio-cni-dashboard")
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard=1", cm.Labels)
	}
	file, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "istio-cni.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fromFile, fromConfigMap any
	if err := json.Unmarshal(file, &fromFile); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(cm.Data["istio-cni.json"]), &fromConfigMap); err != nil {
		t.Fatalf("the ConfigMap's dashboard is not JSON: %v", err)
	}
	if fb, _ := json.Marshal(fromFile); string(fb) != mustMarshal(t, fromConfigMap) {
		t.Error("the ConfigMap's dashboard differs from dashboards/istio-cni.json")
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
