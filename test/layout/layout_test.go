package layout

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/hack/image"
)

const module = "github.com/istio-cni/istio-cni"

// notShipped are the module's trees whose code no shipped binary may link.
var notShipped = []string{module + "/test/", module + "/hack/"}

// goList runs go list in the module's root as the release build does (static).
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %v: %v\n%s", args, err, stderr)
	}
	return strings.Fields(string(out))
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

func harness(pkg string) bool {
	for _, prefix := range notShipped {
		if strings.HasPrefix(pkg, prefix) {
			return true
		}
	}
	return false
}

// The commands under cmd/ are exactly the image's binaries: anything else (a demo,
// a stand-in) lives under hack/ or test/.
func TestCmdHoldsExactlyTheShippedCommands(t *testing.T) {
	var underCmd []string
	for _, pkg := range goList(t, "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./cmd/...") {
		underCmd = append(underCmd, "./"+strings.TrimPrefix(pkg, module+"/"))
	}
	shipped := slices.Sorted(slices.Values(image.AgentBinaries))
	if diff := cmp.Diff(shipped, underCmd); diff != "" {
		t.Errorf("main packages under cmd/ differ from the image's binaries (hack/image.AgentBinaries) (-shipped +cmd/):\n%s", diff)
	}
}

// No shipped command links a package from test/ or hack/.
func TestShippedCommandsLinkNoHarnessCode(t *testing.T) {
	for _, cmd := range image.AgentBinaries {
		t.Run(path.Base(cmd), func(t *testing.T) {
			for _, dep := range goList(t, "-deps", cmd) {
				if harness(dep) {
					t.Errorf("%s links %s, which is not shipped code (test/ or hack/)", cmd, dep)
				}
			}
		})
	}
}

// No product package imports one from test/ or hack/, directly or not, so none can
// bring harness code into a command that starts using it.
func TestProductPackagesImportNoHarnessCode(t *testing.T) {
	lines := goList(t, "-f", "{{.ImportPath}}{{range .Deps}},{{.}}{{end}}", "./internal/...")
	if len(lines) == 0 {
		t.Fatal("go list ./internal/... found no packages")
	}
	for _, line := range lines {
		pkg, deps, _ := strings.Cut(line, ",")
		for _, dep := range strings.Split(deps, ",") {
			if harness(dep) {
				t.Errorf("%s depends on %s, which is not shipped code (test/ or hack/)", pkg, dep)
			}
		}
	}
}

// make test-unit runs its packages (the Makefile's UNIT_PKGS) as an unprivileged
// user with the build tag unitonly: no test file built under that tag may need
// root (root.Require); such a file carries //go:build !unitonly, and make test,
// which runs as root without the tag, runs it.
func TestUnitPackagesHoldNoRootTestUnderTheUnitTag(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(moduleRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(mk), "\nUNIT_PKGS :=")
	if !ok {
		t.Fatal("the Makefile has no UNIT_PKGS")
	}
	var pkgs []string
	for _, line := range strings.Split(rest, "\n") {
		pkgs = append(pkgs, strings.Fields(strings.TrimSuffix(line, "\\"))...)
		if !strings.HasSuffix(line, "\\") {
			break
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("UNIT_PKGS names no package")
	}
	lines := goList(t, append([]string{"-tags", "unitonly", "-f", `{{$d := .Dir}}{{range .TestGoFiles}}{{$d}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$d}}/{{.}} {{end}}`}, pkgs...)...)
	if len(lines) == 0 {
		t.Fatalf("no test files in %v", pkgs)
	}
	for _, f := range lines {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "root.Require(") {
			t.Errorf("%s needs root (root.Require) and is built by make test-unit (tag unitonly): give it //go:build !unitonly", f)
		}
	}
}
