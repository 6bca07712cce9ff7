package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/istio-cni/istio-cni/hack/image"
)

// toolsCache is where built helper tools are kept, keyed by their sources.
const toolsCache = "/var/cache/istio-cni"

// buildTools makes sure hack/node/tools (the pause program and nodetool) is built,
// into a cache directory named after a hash of its sources and the Go version, so
// only the first run after a change pays for the build.
func (n *Node) buildTools(ctx context.Context) error {
	src := filepath.Join(n.root, "hack", "node", "tools")
	key, err := sourceHash(src)
	if err != nil {
		return err
	}
	cache := os.Getenv("ISTIO_CNI_CACHE")
	if cache == "" {
		cache = toolsCache
	}
	dir := filepath.Join(cache, "node-tools-"+key)
	n.tools = dir
	if _, err := os.Stat(filepath.Join(dir, "nodetool")); err == nil {
		return nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("node: create %s: %w", cache, err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".node-tools.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("node: lock tools cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("node: lock tools cache: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodetool")); err == nil {
		return nil // built by someone else while we waited
	}
	n.step("building hack/node/tools into %s (first run only)...", dir)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp+"/", "./pause", "./nodetool")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("node: build hack/node/tools: %w\n%s", err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("node: build hack/node/tools: %w", err)
	}
	return nil
}

// sourceHash hashes the tools module's go.mod, go.sum and Go files, and the Go
// version that builds them.
func sourceHash(dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if name := d.Name(); name != "go.mod" && name != "go.sum" && !strings.HasSuffix(name, ".go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		fmt.Fprintf(h, "%s %d\n", rel, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("node: hash %s: %w", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func (n *Node) nodetool(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.tools, "nodetool"), args...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("nodetool %s: %w: %s", args[0], err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("nodetool %s: %w", args[0], err)
	}
	return string(out), nil
}

// ImportImage builds a single-layer image for this machine's architecture named name (for example
// "istio-cni.local/echo:v1") from files (path in the image -> path on this host;
// executables keep their x bit) with entrypoint, and imports it into the node's
// containerd, where pods can use it with imagePullPolicy IfNotPresent or Never.
// Importing the same name again replaces the image.
func (n *Node) ImportImage(ctx context.Context, name string, files map[string]string, entrypoint []string) error {
	if len(files) == 0 {
		return fmt.Errorf("node: image %s: no files", name)
	}
	spec := image.Spec{Ref: name, Entrypoint: entrypoint, Arch: runtime.GOARCH}
	for dst, src := range files {
		spec.Files = append(spec.Files, image.File{Path: dst, Source: src})
	}
	img, err := image.Build(spec)
	if err != nil {
		return fmt.Errorf("node: build image %s: %w", name, err)
	}
	archive := filepath.Join(n.l.imagesDir(), strings.NewReplacer("/", "_", ":", "_").Replace(name)+".tar")
	if err := image.WriteArchive(archive, name, img); err != nil {
		return fmt.Errorf("node: build image %s: %w", name, err)
	}
	if err := image.Import(ctx, n.Ctr(), n.l.containerdSocket(), archive, name); err != nil {
		return fmt.Errorf("node: import image %s: %w", name, err)
	}
	return os.Remove(archive)
}

// RuntimeCondition is one condition of the container runtime's CRI Status.
type RuntimeCondition struct {
	Status          bool
	Reason, Message string
}

// RuntimeStatus asks containerd for its CRI Status, the call kubelet makes to
// decide whether the node's network is ready: NetworkReady is false when a CNI
// plugin of the network's config list fails its STATUS. It returns the conditions
// by type (RuntimeReady, NetworkReady).
func (n *Node) RuntimeStatus(ctx context.Context) (map[string]RuntimeCondition, error) {
	out, err := n.nodetool(ctx, "status", "-endpoint", "unix://"+n.l.containerdSocket(), "-timeout", "10s")
	if err != nil {
		return nil, err
	}
	conds := map[string]RuntimeCondition{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) == 4 {
			conds[f[0]] = RuntimeCondition{Status: f[1] == "true", Reason: f[2], Message: f[3]}
		}
	}
	return conds, nil
}

// Sandbox is a pod sandbox as the runtime lists it.
type Sandbox struct {
	ID, State, Namespace, Name string
}

// Sandboxes lists the runtime's pod sandboxes (CRI ListPodSandbox).
func (n *Node) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	out, err := n.nodetool(ctx, "pods", "-endpoint", "unix://"+n.l.containerdSocket(), "-timeout", "10s")
	if err != nil {
		return nil, err
	}
	var list []Sandbox
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			continue
		}
		ns, name, _ := strings.Cut(f[2], "/")
		list = append(list, Sandbox{ID: f[0], State: f[1], Namespace: ns, Name: name})
	}
	return list, nil
}
