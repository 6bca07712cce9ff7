package chart

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// TestPlatformAcrossUpgrades: against a real API server, what the platform switch
// lays into the values at render time (the platform's values, GKE's quota, the
// internal __platform and __istioValuesResolved) stays out of the release's stored
// values: helm get values --all holds only the chart's defaults and the user's,
// helm upgrade --reuse-values renders as the install did, and an upgrade that
// takes the platform away (--reuse-values --set global.platform=) renders the
// chart's defaults, its quota gone. Were anything the switch set stored, the
// upgrade without the platform would keep k3s's directories or GKE's quota.
func TestPlatformAcrossUpgrades(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	kc := []string{"--kubeconfig", cp.AdminKubeconfig()}
	for _, c := range []struct {
		platform, ns string
		// platformOnly is in the manifest with the platform and not without it.
		platformOnly string
	}{
		{"k3s", "kube-system", "/var/lib/rancher/k3s/agent/etc/cni/net.d"},
		{"gke", "istio-system", "kind: ResourceQuota"},
	} {
		t.Run(c.platform, func(t *testing.T) {
			ns := []string{"-n", c.ns}
			install := append(append(append([]string{"install", release, chartDir, "--create-namespace", "--set", "global.platform=" + c.platform}, ns...), withHub...), kc...)
			if _, err := helm(t, install...); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := helm(t, append(append([]string{"uninstall", release}, ns...), kc...)...); err != nil {
					t.Error(err)
				}
			})
			manifest := func() string {
				t.Helper()
				out, err := helm(t, append(append([]string{"get", "manifest", release}, ns...), kc...)...)
				if err != nil {
					t.Fatal(err)
				}
				return string(out)
			}
			installed := manifest()
			if !strings.Contains(installed, c.platformOnly) {
				t.Fatalf("the install with platform %s lacks %q:\n%s", c.platform, c.platformOnly, installed)
			}
			all, err := helm(t, append(append([]string{"get", "values", release, "--all", "-o", "json"}, ns...), kc...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, leak := range []string{"__platform", "__istioValuesResolved", `"resourceQuotas":{"enabled":true`, "rancher"} {
				if strings.Contains(string(all), leak) {
					t.Errorf("the release's stored values hold %s, which only the render sets:\n%s", leak, all)
				}
			}

			reuse := append(append(append([]string{"upgrade", release, chartDir, "--reuse-values"}, ns...), withHub...), kc...)
			if _, err := helm(t, reuse...); err != nil {
				t.Fatal(err)
			}
			if got := manifest(); got != installed {
				t.Errorf("helm upgrade --reuse-values renders otherwise than the install")
			}

			if _, err := helm(t, append(reuse, "--set", "global.platform=")...); err != nil {
				t.Fatal(err)
			}
			got := manifest()
			if strings.Contains(got, c.platformOnly) {
				t.Errorf("helm upgrade --reuse-values --set global.platform= still renders %q, which only platform %s sets", c.platformOnly, c.platform)
			}
			if want := "path: " + filepath.Clean("/etc/cni/net.d"); !strings.Contains(got, want) {
				t.Errorf("helm upgrade without the platform lacks the default %q", want)
			}
		})
	}
}
