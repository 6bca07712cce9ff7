package chart

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// renderNotes renders the chart's NOTES.txt, which `helm template` leaves out and `helm
// install` prints: a copy of the chart gets one more template that evaluates the notes
// with tpl, in the same context.
func renderNotes(t *testing.T, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "istio-cni")
	err := filepath.WalkDir(chartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(chartDir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	})
	if err != nil {
		t.Fatalf("copy the chart: %v", err)
	}
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// Files under templates/ are not readable through .Files; the copy's root is.
	if err := os.WriteFile(filepath.Join(dir, "notes-under-test.txt"), notes, 0o644); err != nil {
		t.Fatal(err)
	}
	probe := "notes: |\n{{ tpl (.Files.Get \"notes-under-test.txt\") . | indent 2 }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes-under-test.yaml"), []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"template", release, dir, "--namespace", namespace, "--show-only", "templates/zz-notes-under-test.yaml"}, withHub...), extra...)
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Notes string `json:"notes"`
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("rendered notes: %v\n%s", err, out)
	}
	return doc.Notes
}

// TestNotesTellWhatWasInstalled: the notes helm install prints render for every profile
// and say where the plugin goes, what is excluded and what repair does.
func TestNotesTellWhatWasInstalled(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"default", []string{"-f", profileFile("default")}, []string{
			"kube-system/istio-cni-node", "chain of the first config file in /etc/cni/net.d",
			"Binaries: /opt/cni/bin", "Excluded namespaces: istio-system", "Repair:   delete"}, nil},
		{"gke", []string{"-f", profileFile("gke")}, []string{"Binaries: /home/kubernetes/bin"}, nil},
		{"openshift", []string{"-f", profileFile("openshift")}, []string{
			"standalone file zz-istio-cni.conf in /etc/cni/multus/net.d", "k8s.v1.cni.cncf.io/networks: istio-cni",
			"NetworkAttachmentDefinition istio-cni in: default; the agent adds it to every namespace with meshed pods",
			"never deleted"}, []string{"Multus\nlooks"}},
		{"Multus with the runtime's directory", []string{"--set", "multus.enabled=true", "--set", "chained=false"}, []string{
			"standalone file zz-istio-cni.conf in /etc/cni/net.d", "Multus\nlooks a NetworkAttachmentDefinition without a config up by name in its own directory"}, nil},
		{"openshift, the chart's namespaces only", []string{"-f", profileFile("openshift"), "--set", "multus.meshedNamespaces=false", "--set", "multus.namespaces={bookinfo}"},
			[]string{"NetworkAttachmentDefinition istio-cni in: bookinfo)"}, nil},
		{"seed command", seedArgs, []string{"Excluded namespaces: none"}, nil},
		{"repair in place", []string{"--set", "repair.repairPods=true", "--set", "repair.deletePods=false"}, []string{"Repair:   repair in place, else label"}, nil},
		{"repair off", []string{"--set", "repair.enabled=false"}, []string{"Repair:   off\n"}, nil},
		{"repair with every action off", []string{"--set", "repair.deletePods=false", "--set", "repair.labelPods=false"},
			[]string{"Repair:   off (repair.enabled is true, but repair.repairPods, repair.deletePods and repair.labelPods are all false: nothing to do with a broken pod)"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			notes := renderNotes(t, c.args...)
			for _, w := range c.want {
				if !strings.Contains(notes, w) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			for _, w := range c.not {
				if strings.Contains(notes, w) {
					t.Errorf("notes hold %q:\n%s", w, notes)
				}
			}
		})
	}
}
