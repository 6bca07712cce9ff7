package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// platforms are Istio's platform switch's values (its chart's
// files/profile-platform-*.yaml); each has a profile of the same name here.
var platforms = []string{"gke", "k3d", "k3s", "microk8s", "minikube", "openshift"}

// TestPlatformSwitchRendersAsItsProfile: Istio's install commands set the platform with
// --set global.platform=<name> (or platform); that and -f profiles/<name>.yaml render the
// same objects, byte for byte, in kube-system and in Istio's istio-system, where GKE's
// platform adds the ResourceQuota GKE needs there, and with troubleshooting, which mounts
// cniNetnsDir (minikube's).
func TestPlatformSwitchRendersAsItsProfile(t *testing.T) {
	for _, p := range platforms {
		for _, extra := range [][]string{
			{"--namespace", "kube-system"},
			{"--namespace", "istio-system"},
			{"--namespace", "kube-system", "--set", "troubleshooting.enabled=true"},
		} {
			t.Run(p+" "+strings.Join(extra, " "), func(t *testing.T) {
				want := mustRender(t, append([]string{"-f", profileFile(p)}, extra...)...)
				for _, args := range [][]string{
					{"--set", "platform=" + p},
					{"--set", "global.platform=" + p},
					{"--set", "platform=" + p, "--set", "global.platform=" + p},
					{"--set", "cni.platform=" + p},
				} {
					got := mustRender(t, append(args, extra...)...)
					if diff := cmp.Diff(string(want.raw), string(got.raw)); diff != "" {
						t.Errorf("%v renders otherwise than -f profiles/%s.yaml (-profile +switch):\n%s", args, p, diff)
					}
				}
			})
		}
	}
}

// TestPlatformSetsWhatIstiosPlatformSets: each platform sets, of what Istio's platform
// profile sets for its istio-cni chart, every setting this chart has (Istio's
// manifests/helm-profiles/platform-*.yaml), and what the platform needs of this chart's
// own (OpenShift: a privileged agent). Istio's OpenShift file name for the standalone
// config, istio-cni.conf, is the one left: the chart's zz-istio-cni.conf sorts after the
// node's other configs, and Multus finds either by its network name, istio-cni.
func TestPlatformSetsWhatIstiosPlatformSets(t *testing.T) {
	type node struct {
		binDir, confDir, netnsDir, chained string
		privileged                         bool
		seLinuxType                        string
		nad                                bool
		quota                              any
	}
	// netnsDir: the node's directory mounted for troubleshooting (and repair in place).
	defaults := node{binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: "true"}
	with := func(f func(n *node)) node { n := defaults; f(&n); return n }
	cases := []struct {
		name string
		args []string
		want node
	}{
		{"none", nil, defaults},
		{"empty platform is none", []string{"--set", "platform=", "--set", "global.platform="}, defaults},
		{"gke in kube-system", []string{"--set", "global.platform=gke"}, with(func(n *node) { n.binDir = "/home/kubernetes/bin" })},
		{"gke in istio-system", []string{"--set", "global.platform=gke", "--namespace", "istio-system"}, with(func(n *node) {
			n.binDir = "/home/kubernetes/bin"
			n.quota = "5000 pods of PriorityClass In [system-node-critical]"
		})},
		{"gke in istio-system with resourceQuotas", []string{"--set", "global.platform=gke", "--namespace", "istio-system", "--set", "resourceQuotas.enabled=true", "--set", "resourceQuotas.pods=300"},
			with(func(n *node) {
				n.binDir = "/home/kubernetes/bin"
				n.quota = "300 pods of PriorityClass In [system-node-critical]"
			})},
		{"gke in istio-system with a class GKE admits anywhere", []string{"--set", "global.platform=gke", "--namespace", "istio-system", "--set", "priorityClassName=mesh-node"},
			with(func(n *node) { n.binDir = "/home/kubernetes/bin" })},
		{"k3d", []string{"--set", "global.platform=k3d"}, with(func(n *node) {
			n.binDir, n.confDir = "/bin", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
		{"k3s", []string{"--set", "global.platform=k3s"}, with(func(n *node) {
			n.binDir, n.confDir = "/var/lib/rancher/k3s/data/cni", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
		{"microk8s", []string{"--set", "global.platform=microk8s"}, with(func(n *node) {
			n.binDir, n.confDir = "/var/snap/microk8s/current/opt/cni/bin", "/var/snap/microk8s/current/args/cni-network"
		})},
		{"minikube", []string{"--set", "global.platform=minikube", "--set", "troubleshooting.enabled=true"}, with(func(n *node) {
			n.netnsDir = "/var/run/docker/netns"
		})},
		{"openshift", []string{"--set", "global.platform=openshift"}, with(func(n *node) {
			n.binDir, n.confDir, n.chained = "/var/lib/cni/bin", "/etc/cni/multus/net.d", "false"
			n.privileged, n.seLinuxType, n.nad = true, "spc_t", true
		})},
		// The user's values win over the platform's.
		{"k3s with the user's cniBinDir", []string{"--set", "global.platform=k3s", "--set", "cniBinDir=/opt/k3s/cni"}, with(func(n *node) {
			n.binDir, n.confDir = "/opt/k3s/cni", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
		{"k3s with the user's cniBinDir under cni:", []string{"--set", "platform=k3s", "--set", "cni.cniBinDir=/opt/k3s/cni"}, with(func(n *node) {
			n.binDir, n.confDir = "/opt/k3s/cni", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
		{"k3s from its profile with the user's cniBinDir", []string{"-f", profileFile("k3s"), "--set", "cniBinDir=/opt/k3s/cni"}, with(func(n *node) {
			n.binDir, n.confDir = "/opt/k3s/cni", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
		{"openshift with the user's SELinux type", []string{"--set", "global.platform=openshift", "--set", "seLinuxOptions.type=container_runtime_t"}, with(func(n *node) {
			n.binDir, n.confDir, n.chained = "/var/lib/cni/bin", "/etc/cni/multus/net.d", "false"
			n.privileged, n.seLinuxType, n.nad = true, "container_runtime_t", true
		})},
		{"minikube with the user's netns dir", []string{"--set", "global.platform=minikube", "--set", "troubleshooting.enabled=true", "--set", "cniNetnsDir=/run/netns"}, with(func(n *node) {
			n.netnsDir = "/run/netns"
		})},
		// A profile given with -f is the user's own values: a --set beside it wins
		// whatever its value, the chart's default included (the switch cannot tell
		// that from unset, the file needs not).
		{"openshift from its profile with the user's privileged and multus off", []string{"-f", profileFile("openshift"), "--set", "privileged=false", "--set", "multus.enabled=false"}, with(func(n *node) {
			n.binDir, n.confDir, n.chained = "/var/lib/cni/bin", "/etc/cni/multus/net.d", "false"
			n.seLinuxType = "spc_t"
		})},
		{"k3s from its profile with the user's cniConfDir equal to the default", []string{"-f", profileFile("k3s"), "--set", "cniConfDir=/etc/cni/net.d"}, with(func(n *node) {
			n.binDir = "/var/lib/rancher/k3s/data/cni"
		})},
		// The corner case the chart README names: a value equal to the chart's default
		// cannot be told from it, so the platform's is taken.
		{"k3s with the user's cniConfDir equal to the default", []string{"--set", "global.platform=k3s", "--set", "cniConfDir=/etc/cni/net.d"}, with(func(n *node) {
			n.binDir, n.confDir = "/var/lib/rancher/k3s/data/cni", "/var/lib/rancher/k3s/agent/etc/cni/net.d"
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustRender(t, c.args...)
			env := m.env(t)
			got := node{binDir: env["CNI_BIN_DIR"], confDir: env["CNI_NET_DIR"], chained: env["CHAINED_CNI_PLUGIN"], quota: quotaPods(t, m)}
			if bin := networkConfig(t, m)["kubernetes"].(map[string]any)["cni_bin_dir"]; bin != got.binDir {
				t.Errorf("the plugin's kubernetes.cni_bin_dir %v, the agent's CNI_BIN_DIR %s", bin, got.binDir)
			}
			paths := m.hostPaths(t)
			if paths[got.binDir] == "" || paths[got.confDir] == "" {
				t.Errorf("the node's %s and %s are not both mounted: %v", got.binDir, got.confDir, paths)
			}
			for host, mount := range paths {
				if mount == "/host/var/run/netns" { // with troubleshooting or repair in place only
					got.netnsDir = host
				}
			}
			sc := m.agent(t).SecurityContext
			got.privileged = sc.Privileged != nil && *sc.Privileged
			if sc.SELinuxOptions != nil {
				got.seLinuxType = sc.SELinuxOptions.Type
			}
			got.nad = m.find("NetworkAttachmentDefinition", "istio-cni") != nil
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(node{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestAValueAtTheChartsDefaultIsThePlatforms: for every key a platform profile sets, a
// user's value equal to the chart's default (values.yaml) renders as the profile, whose
// value is the platform's (the chart cannot tell it from the default; the template's
// table of defaults, istio-cni.platformDefaults, must agree with values.yaml).
func TestAValueAtTheChartsDefaultIsThePlatforms(t *testing.T) {
	data, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(data, &defaults); err != nil {
		t.Fatal(err)
	}
	for _, p := range platforms {
		data, err := os.ReadFile(profileFile(p))
		if err != nil {
			t.Fatal(err)
		}
		var profile map[string]any
		if err := yaml.Unmarshal(data, &profile); err != nil {
			t.Fatal(err)
		}
		if profile["platformProfile"] != p {
			t.Errorf("profiles/%s.yaml: platformProfile %v, want %s (the switch reads the file it names)", p, profile["platformProfile"], p)
		}
		delete(profile, "platformProfile")
		// troubleshooting mounts cniNetnsDir, so that minikube's shows in the render.
		want := mustRender(t, "-f", profileFile(p), "--set", "troubleshooting.enabled=true")
		for _, key := range leafKeys(profile, "") {
			def, ok := lookup(defaults, key)
			if !ok {
				// No default for this key (seLinuxOptions.type): unset is absent.
				continue
			}
			t.Run(p+" "+key, func(t *testing.T) {
				got := mustRender(t, "--set", "platform="+p, "--set", "troubleshooting.enabled=true", "--set-json", key+"="+mustJSON(t, def))
				if diff := cmp.Diff(string(want.raw), string(got.raw)); diff != "" {
					t.Errorf("%s=%v (values.yaml's default) with platform %s renders otherwise than -f profiles/%s.yaml (-profile +with it):\n%s", key, def, p, p, diff)
				}
			})
		}
	}
}

func leafKeys(m map[string]any, prefix string) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			out = append(out, leafKeys(sub, prefix+k+".")...)
			continue
		}
		out = append(out, prefix+k)
	}
	sort.Strings(out)
	return out
}

func lookup(m map[string]any, key string) (any, bool) {
	var cur any = m
	for _, part := range strings.Split(key, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

// TestPlatformsOtherThanIstiosAreRefused: a platform Istio has no profile for (EKS and
// AKS need none), one in another case, or platform and global.platform set to two
// different ones, fail the install before anything is created, with these messages.
func TestPlatformsOtherThanIstiosAreRefused(t *testing.T) {
	unknown := func(field, value string) string {
		return fmt.Sprintf(`%s %q is not one of Istio's platforms gke, k3d, k3s, microk8s, minikube and openshift (in lower case); EKS, AKS, kind and kubeadm clusters need no platform (Istio has none for them: the chart's defaults fit them), so leave %s empty`, field, value, field)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"eks", []string{"--set", "global.platform=eks"}, unknown("global.platform", "eks")},
		{"aks", []string{"--set", "platform=aks"}, unknown("platform", "aks")},
		{"kind", []string{"--set", "global.platform=kind"}, unknown("global.platform", "kind")},
		{"another case", []string{"--set", "platform=Gke"}, unknown("platform", "Gke")},
		{"under cni", []string{"--set", "cni.platform=eks"}, unknown("platform", "eks")},
		{"the chart's default profile is none of Istio's", []string{"--set", "platform=default"}, unknown("platform", "default")},
		{"unknown in global with platform equal", []string{"--set", "platform=eks", "--set", "global.platform=eks"}, unknown("platform", "eks")},
		{"both, different", []string{"--set", "platform=k3s", "--set", "global.platform=k3d"},
			`platform is "k3s" and global.platform is "k3d": two different platforms; set one of them, or both to the same`},
		{"a profile and another platform", []string{"-f", profileFile("openshift"), "--set", "global.platform=gke"},
			`global.platform is "gke", but the values come from the profile of openshift (-f profiles/openshift.yaml: platformProfile "openshift"): two different platforms; keep one of them`},
		{"a profile's marker set by hand", []string{"--set", "platformProfile=eks"},
			`platformProfile "eks" is not one of this chart's profiles gke, k3d, k3s, microk8s, minikube and openshift: it is set by the profile files (-f charts/istio-cni/profiles/<platform>.yaml), not by hand`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantRefused(t, c.args, []string{c.want}) })
	}
}

// TestGKEPlatformsQuotaKeepsTheKubeSystemCheck: the GKE platform's ResourceQuota never
// goes into kube-system (it would cap every pod of the class there): asked for there
// explicitly it is refused as before, and GKE's bin dir without the platform outside
// kube-system still needs resourceQuotas.enabled.
func TestGKEPlatformsQuotaKeepsTheKubeSystemCheck(t *testing.T) {
	for _, args := range [][]string{
		{"--set", "global.platform=gke", "--set", "resourceQuotas.enabled=true"},
		{"-f", profileFile("gke"), "--set", "resourceQuotas.enabled=true"},
		{"--set", "platform=gke", "-f", istioFile("gke")},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			wantRefused(t, args, []string{"resourceQuotas.enabled is true, but the release namespace is kube-system", "resourceQuotas.pods (5000)"})
		})
	}
	wantRefused(t, []string{"--set", "cniBinDir=/home/kubernetes/bin", "--namespace", "istio-system"},
		[]string{"cniBinDir is /home/kubernetes/bin (GKE), but the release namespace is istio-system and resourceQuotas.enabled is false"})
	if d := mustRender(t, "--set", "global.platform=gke").find("ResourceQuota", "istio-cni-resource-quota"); d != nil {
		t.Errorf("GKE's platform in kube-system: ResourceQuota %s, want none", d)
	}
}

// TestNotesNameThePlatformAndWhatItSet: the install notes say which values the platform
// set, so that a value of the user's equal to the chart's default, which it replaced, is
// seen.
func TestNotesNameThePlatformAndWhatItSet(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "global.platform=k3s"}, "  Platform: k3s, which set cniBinDir, cniConfDir (where your values left them unset or at the chart's default)\n"},
		{[]string{"--set", "global.platform=k3s", "--set", "cniBinDir=/opt/k3s/cni"}, "  Platform: k3s, which set cniConfDir (where"},
		{[]string{"--set", "global.platform=gke", "--namespace", "istio-system"}, "  Platform: gke, which set cniBinDir, resourceQuotas.enabled (where"},
		{[]string{"-f", profileFile("openshift")}, "  Platform: openshift, whose every value your own values set already\n"},
		{[]string{"--set", "platform=openshift"}, "  Platform: openshift, which set chained, cniBinDir, cniConfDir, multus.enabled, privileged, seLinuxOptions.type (where"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			if notes := renderNotes(t, c.args...); !strings.Contains(notes, c.want) {
				t.Errorf("notes lack %q:\n%s", c.want, notes)
			}
		})
	}
	if notes := renderNotes(t); strings.Contains(notes, "Platform:") {
		t.Errorf("notes without a platform name one:\n%s", notes)
	}
}

// TestThePackagedChartCarriesItsPlatforms: the chart make push publishes is helm
// package's archive, installed by reference with no clone at hand, so the switch must
// find its profiles in the archive: rendered from it, each platform is as its profile
// given with -f.
func TestThePackagedChartCarriesItsPlatforms(t *testing.T) {
	dir := t.TempDir()
	if _, err := helm(t, "package", chartDir, "--destination", dir); err != nil {
		t.Fatal(err)
	}
	archives, err := filepath.Glob(filepath.Join(dir, "*.tgz"))
	if err != nil || len(archives) != 1 {
		t.Fatalf("helm package wrote %v (%v), want one archive", archives, err)
	}
	for _, p := range platforms {
		want := mustRender(t, "-f", profileFile(p))
		out, err := helm(t, append([]string{"template", release, archives[0], "--namespace", namespace, "--kube-version", defaultKubeVersion()},
			append(withHub, "--set", "global.platform="+p)...)...)
		if err != nil {
			t.Fatalf("platform %s from the archive: %v", p, err)
		}
		if diff := cmp.Diff(string(want.raw), string(out)); diff != "" {
			t.Errorf("platform %s renders otherwise from the archive than -f profiles/%s.yaml (-profile +archive):\n%s", p, p, diff)
		}
	}
}
