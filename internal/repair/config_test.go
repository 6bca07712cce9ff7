package repair

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/istio-cni/istio-cni/test/harness/envmap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var env = envmap.Lookup

func TestConfigFromEnvDefaultsAreIstios(t *testing.T) {
	got, err := ConfigFromEnv(env("NODE_NAME", "node-1"))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.NodeName, want.AgentNode = "node-1", "node-1"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if !got.Enabled || !got.RepairPods || got.DeletePods || got.LabelPods || got.InitExitCode != 126 ||
		got.InitContainerName != "istio-validation" || got.LabelKey != "cni.istio.io/uninitialized" || got.LabelValue != "true" {
		t.Errorf("defaults differ from Istio's: %+v", got)
	}
	if got.fieldSelector() != "spec.nodeName=node-1" {
		t.Errorf("field selector %q", got.fieldSelector())
	}
}

func TestConfigFromEnvReadsEverySetting(t *testing.T) {
	got, err := ConfigFromEnv(env(
		EnvEnabled, "true", EnvRepairPods, "false", EnvDeletePods, "1", EnvLabelPods, "true",
		EnvLabelKey, "example.com/broken", EnvLabelValue, "yes", "NODE_NAME", "ignored", EnvNodeName, "node-2",
		EnvSidecarAnnotation, "example.com/injected", EnvInitContainerName, "check", EnvInitTerminationMsg, "no capture",
		EnvInitExitCode, "0", EnvLabelSelectors, "app=web", EnvFieldSelectors, "metadata.namespace!=kube-system",
		EnvMaxRetries, "3", EnvRetryBase, "1s", EnvRetryMax, "1m", EnvProcDir, "/host/proc", EnvNetnsDirs, "/run/netns, /var/run/docker/netns",
	))
	if err != nil {
		t.Fatal(err)
	}
	if got.RepairPods || !got.DeletePods || !got.LabelPods || got.NodeName != "node-2" || got.InitExitCode != 0 ||
		got.InitContainerName != "check" || got.MaxRetries != 3 || got.ProcDir != "/host/proc" ||
		got.AgentNode != "ignored" || !cmp.Equal(got.NetnsDirs, []string{"/run/netns", "/var/run/docker/netns"}) {
		t.Errorf("settings not read: %+v", got)
	}
	if got.fieldSelector() != "spec.nodeName=node-2,metadata.namespace!=kube-system" {
		t.Errorf("field selector %q", got.fieldSelector())
	}
}

func TestConfigFromEnvRejectsBadSettingsNamingThem(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want []string // each must appear in the error
	}{
		{"no node", nil, []string{EnvNodeName}},
		{"bad bool", []string{"NODE_NAME", "n", EnvDeletePods, "yes please"}, []string{EnvDeletePods, `"yes please"`}},
		{"bad label", []string{"NODE_NAME", "n", EnvLabelPods, "true", EnvLabelKey, "not a key", EnvLabelValue, "has space"}, []string{EnvLabelKey, EnvLabelValue}},
		{"exit code", []string{"NODE_NAME", "n", EnvInitExitCode, "300"}, []string{EnvInitExitCode, "300"}},
		{"exit code not a number", []string{"NODE_NAME", "n", EnvInitExitCode, "x"}, []string{EnvInitExitCode}},
		{"any container any code", []string{"NODE_NAME", "n", EnvInitContainerName, "", EnvInitExitCode, "0"}, []string{EnvInitContainerName}},
		{"selectors", []string{"NODE_NAME", "n", EnvLabelSelectors, "a in (", EnvFieldSelectors, "spec.nodeName=other"}, []string{EnvLabelSelectors, EnvFieldSelectors}},
		{"node name", []string{EnvNodeName, "Node_1"}, []string{EnvNodeName, "Node_1"}},
		// An in-place repair searches this node's namespaces: another node's pods
		// are not there, and whatever holds their addresses here is not them.
		{"in-place repair of another node", []string{"NODE_NAME", "n", EnvNodeName, "other"}, []string{EnvNodeName, `"other"`, `NODE_NAME="n"`, EnvRepairPods}},
		{"retries", []string{"NODE_NAME", "n", EnvMaxRetries, "0", EnvRetryBase, "2s", EnvRetryMax, "1s"}, []string{EnvMaxRetries, EnvRetryMax}},
		{"paths", []string{"NODE_NAME", "n", EnvProcDir, "proc", EnvNetnsDirs, "netns"}, []string{EnvProcDir, EnvNetnsDirs}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envmap.CheckRejected(t, ConfigFromEnv, tc.env, tc.want...)
		})
	}
	if _, err := ConfigFromEnv(env(EnvEnabled, "false")); err != nil {
		t.Errorf("disabled config rejected: %v", err)
	}
}

// TestConfigFromEnvReadsIstiosSwitchesAsIstiosInstallCNIDoes: Istio's install-cni
// takes a switch set but empty as false (not as its default), and runs a repair
// controller with every action off, which then does nothing with a broken pod;
// here that controller is not started (Idle).
func TestConfigFromEnvReadsIstiosSwitchesAsIstiosInstallCNIDoes(t *testing.T) {
	for _, tc := range []struct {
		name                                 string
		env                                  []string
		enabled, idle, repair, delete, label bool
	}{
		{name: "defaults", enabled: true, repair: true},
		{name: "REPAIR_ENABLED empty is false", env: []string{EnvEnabled, ""}, repair: true},
		{name: "REPAIR_ENABLED blank is false", env: []string{EnvEnabled, "  "}, repair: true},
		{name: "REPAIR_REPAIR_PODS empty is false, so nothing is done",
			env: []string{EnvRepairPods, ""}, idle: true},
		{name: "REPAIR_REPAIR_PODS empty beside deleting",
			env: []string{EnvRepairPods, "", EnvDeletePods, "true", EnvLabelPods, ""}, enabled: true, delete: true},
		{name: "labelling alone", env: []string{EnvRepairPods, "false", EnvDeletePods, " ", EnvLabelPods, "1"}, enabled: true, label: true},
		{name: "every action off", env: []string{EnvEnabled, "true", EnvRepairPods, "false", EnvDeletePods, "false", EnvLabelPods, "false"}, idle: true},
		{name: "every action off and disabled", env: []string{EnvEnabled, "false", EnvRepairPods, "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigFromEnv(env(append([]string{"NODE_NAME", "n"}, tc.env...)...))
			if err != nil {
				t.Fatal(err)
			}
			if got.Enabled != tc.enabled || got.Idle != tc.idle || got.RepairPods != tc.repair || got.DeletePods != tc.delete || got.LabelPods != tc.label {
				t.Errorf("enabled %t, idle %t, repair %t, delete %t, label %t; want %t, %t, %t, %t, %t",
					got.Enabled, got.Idle, got.RepairPods, got.DeletePods, got.LabelPods, tc.enabled, tc.idle, tc.repair, tc.delete, tc.label)
			}
		})
	}
}

// TestConfigFromEnvReadsAnEmptyExitCodeAsIstiosInstallCNIDoes: Istio's reads
// REPAIR_INIT_CONTAINER_EXIT_CODE set but empty as 0, which matches any code.
func TestConfigFromEnvReadsAnEmptyExitCodeAsIstiosInstallCNIDoes(t *testing.T) {
	got, err := ConfigFromEnv(env("NODE_NAME", "n", EnvInitExitCode, " "))
	if err != nil {
		t.Fatal(err)
	}
	if got.InitExitCode != 0 {
		t.Errorf("exit code %d, want 0 (any code)", got.InitExitCode)
	}
}

func TestBrokenFollowsIstiosRule(t *testing.T) {
	term := func(code int32, msg string) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}
	}
	pod := func(ann bool, statuses ...corev1.ContainerStatus) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n", Annotations: map[string]string{}}}
		if ann {
			p.Annotations[DefaultSidecarAnnotation] = "{}"
		}
		p.Status.InitContainerStatuses = statuses
		return p
	}
	st := func(name string, now, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
		s := corev1.ContainerStatus{Name: name}
		s.State.Terminated, s.LastTerminationState.Terminated = now, last
		return s
	}
	cfg := DefaultConfig()
	anyCode := DefaultConfig()
	anyCode.InitExitCode = 0
	withMsg := DefaultConfig()
	withMsg.InitTerminationMsg = " not redirected "
	deleting := pod(true, st("istio-validation", term(126, ""), nil))
	deleting.DeletionTimestamp = &metav1.Time{}
	hostNet := pod(true, st("istio-validation", term(126, ""), nil))
	hostNet.Spec.HostNetwork = true
	for _, tc := range []struct {
		name string
		cfg  Config
		pod  *corev1.Pod
		want bool
	}{
		{"terminated with 126", cfg, pod(true, st("istio-validation", term(126, ""), nil)), true},
		{"crash-looping: last termination 126", cfg, pod(true, st("istio-validation", nil, term(126, ""))), true},
		{"re-ran and passed after a failure", cfg, pod(true, st("istio-validation", term(0, ""), term(126, ""))), false},
		{"no sidecar annotation", cfg, pod(false, st("istio-validation", term(126, ""), nil)), false},
		{"another init container failed", cfg, pod(true, st("init-db", term(126, ""), nil)), false},
		{"other exit code", cfg, pod(true, st("istio-validation", term(1, ""), nil)), false},
		{"any code when 0", anyCode, pod(true, st("istio-validation", term(1, ""), nil)), true},
		{"message must match, trimmed", withMsg, pod(true, st("istio-validation", term(126, "not redirected\n"), nil)), true},
		{"message differs", withMsg, pod(true, st("istio-validation", term(126, "other"), nil)), false},
		{"no status yet", cfg, pod(true), false},
		{"being deleted", cfg, deleting, false},
		{"host network", cfg, hostNet, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := Broken(&tc.cfg, tc.pod)
			if got != tc.want {
				t.Errorf("Broken = %v (%q), want %v", got, why, tc.want)
			}
			if got && !strings.Contains(why, "istio-validation exited with code") {
				t.Errorf("reason %q", why)
			}
		})
	}
}
