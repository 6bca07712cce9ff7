// Package repo finds the repository's root for the tests and the developer
// programs that read its files (the chart, hack/ scripts, testdata) or build its
// commands.
package repo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Module is the module path of the repository's root go.mod.
const Module = "github.com/istio-cni/istio-cni"

// Root is the repository's root: the nearest directory at or above the working
// directory (a test's package directory) whose go.mod is that of module Module.
// The nested modules (hack/kube/..., hack/tools/..., hack/node/tools) have go.mod
// files of other modules, and are passed over.
func Root() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the repository's root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(data) == Module {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find the repository's root: no go.mod of module %s at or above %s: run from inside the repository", Module, wd)
		}
	}
}

// modulePath is the path its module directive gives in the go.mod data, "" when
// it has none.
func modulePath(data []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}
