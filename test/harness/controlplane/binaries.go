package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/istio-cni/istio-cni/test/harness/repo"
)

// binaryNames are the programs a control plane runs.
var binaryNames = []string{"etcd", "kube-apiserver"}

// buildMu serialises runs of hack/kube-binaries.sh within this process: two control
// planes started in parallel must not build the same binaries twice at once.
var buildMu sync.Mutex

// locateBinaries returns the directory holding etcd and kube-apiserver: opts.BinDir,
// else $KUBE_BIN_DIR, else the cache directory printed by hack/kube-binaries.sh
// (which builds the binaries on its first run).
func locateBinaries(ctx context.Context, opts Options) (string, error) {
	if opts.BinDir != "" {
		return opts.BinDir, checkBinaries(opts.BinDir, "Options.BinDir")
	}
	if dir := os.Getenv("KUBE_BIN_DIR"); dir != "" {
		return dir, checkBinaries(dir, "$KUBE_BIN_DIR")
	}
	root, err := repo.Root()
	if err != nil {
		return "", fmt.Errorf("find binaries (set Options.BinDir or $KUBE_BIN_DIR, or run from inside the repository): %w", err)
	}
	dir, err := runBuildScript(ctx, root, opts.BuildOutput)
	if err != nil {
		return "", err
	}
	return dir, checkBinaries(dir, "hack/kube-binaries.sh output")
}

func checkBinaries(dir, source string) error {
	var missing []string
	for _, name := range binaryNames {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, path)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("binaries from %s: missing or not executable: %s (build them with hack/kube-binaries.sh)",
			source, strings.Join(missing, ", "))
	}
	return nil
}

// runBuildScript runs hack/kube-binaries.sh and returns the directory it prints
// last. Its progress (stderr) goes to progress so a first, slow build is visible.
func runBuildScript(ctx context.Context, root string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = os.Stderr
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	// Other test binaries (go test ./... runs packages in parallel) may run the
	// script at the same moment: it serializes builders itself (flock on a file
	// in its cache directory), leaving nothing outside the cache.
	script := filepath.Join(root, "hack", "kube-binaries.sh")
	var stdout bytes.Buffer
	var stderrTail tailBuffer
	cmd := exec.CommandContext(ctx, script)
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = io.MultiWriter(progress, &stderrTail)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("run %s: %w\n%s", script, err, stderrTail.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", errors.New("hack/kube-binaries.sh printed no directory")
	}
	return dir, nil
}

// tailBuffer keeps the last few KiB written to it, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 4096

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailBytes {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailBytes:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
