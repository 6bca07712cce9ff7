package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/istio-cni/istio-cni/hack/image"
	"github.com/istio-cni/istio-cni/test/harness/registry"
)

const repoRoot = "../.."

// pushBin is the push command, built once for the tests that run it as a user does.
var pushBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "push-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pushBin = filepath.Join(dir, "push")
	if out, err := exec.Command("go", "build", "-o", pushBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./hack/push: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func startRegistry(t *testing.T, opts registry.Options) *registry.Registry {
	t.Helper()
	opts.Dir = t.TempDir()
	r, err := registry.Start(context.Background(), repoRoot, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// result is one run of the push command.
type result struct {
	stdout, stderr string
	err            error
	took           time.Duration
}

// runPush runs the push command as a user would, with the docker config dir
// dockerConfig (DOCKER_CONFIG) and a HOME of its own, so nothing of the machine's
// user is read.
func runPush(t *testing.T, dockerConfig string, args ...string) result {
	t.Helper()
	cmd := exec.Command(pushBin, args...)
	cmd.Dir = repoRoot
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+dockerConfig, "HOME="+home, "XDG_RUNTIME_DIR="+home, "REGISTRY_AUTH_FILE="+filepath.Join(home, "none.json"),
		"HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), err: err, took: time.Since(began)}
	t.Logf("push %s\n  took %s, err %v\n  stdout: %s\n  stderr: %s", strings.Join(args, " "), r.took.Round(time.Millisecond), err, r.stdout, r.stderr)
	return r
}

// testImage is a small image of one file, built and archived as make image does
// (hack/image), for the platform given.
func testImage(t *testing.T, content, arch string) v1.Image {
	t.Helper()
	f := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := image.Build(image.Spec{Ref: "istio-cni.local/install-cni:dev", Files: []image.File{{Path: "/hello", Source: f}}})
	if err != nil {
		t.Fatal(err)
	}
	if arch != "amd64" {
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cfg = cfg.DeepCopy()
		cfg.Architecture = arch
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func testArchive(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	archive := filepath.Join(dir, "install-cni_dev.oci.tar")
	if err := image.WriteArchive(archive, "istio-cni.local/install-cni:dev", img); err != nil {
		t.Fatal(err)
	}
	return archive
}

// registryOptions read the registry as a client that trusts its CA and knows its
// account.
func registryOptions(r *registry.Registry) []remote.Option {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.CAPEM)
	return []remote.Option{
		remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}),
		remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}),
	}
}

func digestAt(t *testing.T, r *registry.Registry, ref string) v1.Hash {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Head(tag, registryOptions(r)...)
	if err != nil {
		t.Fatalf("HEAD %s: %v", ref, err)
	}
	return d.Digest
}

// storageState lists every file of the registry's storage with its size and
// modification time: what a push changed.
func storageState(t *testing.T, r *registry.Registry) map[string]string {
	t.Helper()
	root := filepath.Join(filepath.Dir(r.CAFile), "storage")
	state := map[string]string{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		state[strings.TrimPrefix(p, root)] = fmt.Sprintf("%d %s", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func dockerConfig(t *testing.T, r *registry.Registry, password string) string {
	t.Helper()
	dir, err := r.DockerConfig(t.TempDir(), r.User, password)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPushedImageIsTheArchivesAndASecondPushChangesNothing: the image make image
// archived arrives under HUB/install-cni:TAG with the archive's digest, printed;
// pushing the same build again uploads and rewrites nothing in the registry.
func TestPushedImageIsTheArchivesAndASecondPushChangesNothing(t *testing.T) {
	r := startRegistry(t, registry.Options{})
	img := testImage(t, "one", "amd64")
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	archive := testArchive(t, img)
	creds := dockerConfig(t, r, r.Password)
	hub := r.Host + "/mesh"
	args := []string{"-hub", hub, "-tag", "1.0.0", "-ca-file", r.CAFile, "-archive", archive, "-chart", ""}

	first := runPush(t, creds, args...)
	if first.err != nil {
		t.Fatalf("push: %v\n%s", first.err, first.stderr)
	}
	ref := hub + "/install-cni:1.0.0"
	if got := digestAt(t, r, ref); got != want {
		t.Errorf("the registry's %s is %s, want the archive's %s", ref, got, want)
	}
	if !strings.Contains(first.stdout, ref+"@"+want.String()+" (pushed)") {
		t.Errorf("push printed %q, want it to name %s@%s as pushed", first.stdout, ref, want)
	}

	before := storageState(t, r)
	second := runPush(t, creds, args...)
	if second.err != nil {
		t.Fatalf("second push: %v\n%s", second.err, second.stderr)
	}
	if !strings.Contains(second.stdout, ref+"@"+want.String()+" (unchanged") {
		t.Errorf("second push printed %q, want it to say %s@%s is unchanged", second.stdout, ref, want)
	}
	if diff := mapDiff(before, storageState(t, r)); diff != "" {
		t.Errorf("the second push of the same build changed the registry's storage:\n%s", diff)
	}
	// A new build under the same tag moves the tag.
	img2 := testImage(t, "two", "amd64")
	want2, _ := img2.Digest()
	if res := runPush(t, creds, "-hub", hub, "-tag", "1.0.0", "-ca-file", r.CAFile, "-archive", testArchive(t, img2), "-chart", ""); res.err != nil {
		t.Fatalf("push of another build: %v\n%s", res.err, res.stderr)
	}
	if got := digestAt(t, r, ref); got != want2 {
		t.Errorf("after pushing another build %s is %s, want %s", ref, got, want2)
	}
}

func mapDiff(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if b[k] != v {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: added %q", k, v))
		}
	}
	return strings.Join(out, "\n")
}

// TestPushesAMultiArchIndexAsAnIndex: an OCI layout holding a multi-arch image,
// either as one index in index.json or as one image per platform listed in
// index.json, arrives as an index of both platforms.
func TestPushesAMultiArchIndexAsAnIndex(t *testing.T) {
	r := startRegistry(t, registry.Options{})
	creds := dockerConfig(t, r, r.Password)
	amd, arm := testImage(t, "multi", "amd64"), testImage(t, "multi", "arm64")
	platformDesc := func(arch string) v1.Descriptor {
		return v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: platformDesc("amd64")},
		mutate.IndexAddendum{Add: arm, Descriptor: platformDesc("arm64")})
	nameAnn := layout.WithAnnotations(map[string]string{"io.containerd.image.name": "istio-cni.local/install-cni:dev"})

	// As make image may write them: layout directories in the images directory.
	nested := t.TempDir()
	p, err := layout.Write(filepath.Join(nested, "install-cni"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, nameAnn); err != nil {
		t.Fatal(err)
	}
	flat := t.TempDir()
	if p, err = layout.Write(filepath.Join(flat, "install-cni"), empty.Index); err != nil {
		t.Fatal(err)
	}
	for _, img := range []struct {
		img  v1.Image
		arch string
	}{{amd, "amd64"}, {arm, "arm64"}} {
		if err := p.AppendImage(img.img, nameAnn, layout.WithPlatform(*platformDesc(img.arch).Platform)); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct{ name, dir string }{{"index in index.json", nested}, {"one image per platform in index.json", flat}} {
		t.Run(tc.name, func(t *testing.T) {
			tag := strings.ReplaceAll(tc.name, " ", "-")[:5] + "-1.0.0"
			res := runPush(t, creds, "-hub", r.Host+"/mesh", "-tag", tag, "-ca-file", r.CAFile, "-images", tc.dir, "-chart", "")
			if res.err != nil {
				t.Fatalf("push: %v\n%s", res.err, res.stderr)
			}
			ref, _ := name.NewTag(r.Host + "/mesh/install-cni:" + tag)
			got, err := remote.Index(ref, registryOptions(r)...)
			if err != nil {
				t.Fatalf("the registry's %s is not an index: %v", ref, err)
			}
			m, err := got.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var platforms []string
			for _, d := range m.Manifests {
				platforms = append(platforms, d.Platform.String())
				if _, err := remote.Image(ref.Context().Digest(d.Digest.String()), registryOptions(r)...); err != nil {
					t.Errorf("manifest %s of the index is not in the registry: %v", d.Digest, err)
				}
			}
			if strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
				t.Errorf("index platforms %v, want linux/amd64 and linux/arm64", platforms)
			}
			if !strings.Contains(res.stdout, "index of 2 manifests (linux/amd64, linux/arm64)") {
				t.Errorf("push printed %q, want it to say it pushed an index of both platforms", res.stdout)
			}
		})
	}
}

// TestPushFailuresNameTheRegistryAndTheReasonInTime: each way a push can fail gives
// an error that names the registry and says why, within the stated bound, and
// pushes nothing.
func TestPushFailuresNameTheRegistryAndTheReasonInTime(t *testing.T) {
	r := startRegistry(t, registry.Options{})
	readOnly := startRegistry(t, registry.Options{ReadOnly: true})
	stopped := startRegistry(t, registry.Options{})
	if err := stopped.Stop(); err != nil {
		t.Fatal(err)
	}
	otherCA := startRegistry(t, registry.Options{}) // its CA is not r's
	// A server that accepts connections and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	archive := testArchive(t, testImage(t, "fail", "amd64"))
	good := dockerConfig(t, r, r.Password)

	for _, tc := range []struct {
		name   string
		host   string
		ca     string
		creds  string
		want   []string
		within time.Duration
	}{{
		name: "wrong password", host: r.Host, ca: r.CAFile, creds: dockerConfig(t, r, "wrong"),
		want:   []string{"registry " + r.Host + ": authentication failed (HTTP 401", `user "pusher"`, "docker login " + r.Host},
		within: answerBound,
	}, {
		name: "no credentials", host: r.Host, ca: r.CAFile, creds: t.TempDir(),
		want:   []string{"registry " + r.Host + ": authentication failed (HTTP 401", "no credentials (none found for " + r.Host + ")"},
		within: answerBound,
	}, {
		name: "CA not given", host: r.Host, creds: good,
		want:   []string{"registry " + r.Host + ": TLS: its certificate is signed by an unknown authority", "CA_FILE="},
		within: answerBound,
	}, {
		name: "another CA given", host: r.Host, ca: otherCA.CAFile, creds: good,
		want:   []string{"registry " + r.Host + ": TLS: its certificate is signed by an unknown authority", "the CA file " + otherCA.CAFile + " does not hold the CA"},
		within: answerBound,
	}, {
		name: "registry stopped", host: stopped.Host, ca: stopped.CAFile, creds: dockerConfig(t, stopped, stopped.Password),
		want:   []string{"registry " + stopped.Host + ": connection refused"},
		within: answerBound,
	}, {
		name: "registry does not answer", host: silent.Addr().String(), ca: r.CAFile, creds: good,
		want: []string{"registry " + silent.Addr().String()},
		// The TLS handshake's bound, or the first contact's, whichever ends first.
		within: answerBound + 2*time.Second,
	}, {
		name: "push refused (read-only registry)", host: readOnly.Host, ca: readOnly.CAFile, creds: dockerConfig(t, readOnly, readOnly.Password),
		want:   []string{"registry " + readOnly.Host + " refused the push (HTTP 405"},
		within: answerBound,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"-hub", tc.host + "/mesh", "-tag", "1.0.0", "-archive", archive, "-chart", ""}
			if tc.ca != "" {
				args = append(args, "-ca-file", tc.ca)
			}
			res := runPush(t, tc.creds, args...)
			if res.err == nil {
				t.Fatalf("push succeeded, want a failure")
			}
			for _, w := range tc.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr %q does not say %q", res.stderr, w)
				}
			}
			if res.took > tc.within {
				t.Errorf("failed after %s, want within %s", res.took, tc.within)
			}
		})
	}
	// Nothing arrived in the registry the failed pushes were aimed at.
	tag, _ := name.NewTag(r.Host + "/mesh/install-cni:1.0.0")
	if _, err := remote.Head(tag, registryOptions(r)...); err == nil {
		t.Errorf("%s exists after only failed pushes", tag)
	}
}

// TestPushedChartDefaultsToThePushedImageAndHelmInstallsIt: the chart goes to
// HUB/charts/istio-cni with version TAG (without its v) and appVersion TAG; helm
// reads it from the registry with the credentials of the docker config, and it
// renders the pushed image by digest without any value set. A second push of the
// same build leaves the image and the chart as they are.
func TestPushedChartDefaultsToThePushedImageAndHelmInstallsIt(t *testing.T) {
	r := startRegistry(t, registry.Options{})
	creds := dockerConfig(t, r, r.Password)
	img := testImage(t, "chart", "amd64")
	digest, _ := img.Digest()
	archive := testArchive(t, img)
	hub := r.Host + "/mesh"
	args := []string{"-hub", hub, "-tag", "v1.2.3", "-ca-file", r.CAFile, "-archive", archive}
	first := runPush(t, creds, args...)
	if first.err != nil {
		t.Fatalf("push: %v\n%s", first.err, first.stderr)
	}
	chartRef := hub + "/charts/istio-cni:1.2.3"
	if !strings.Contains(first.stdout, "chart "+chartRef+"@sha256:") || !strings.Contains(first.stdout, "helm install istio-cni oci://"+hub+"/charts/istio-cni --version 1.2.3 --ca-file "+r.CAFile) {
		t.Errorf("push printed %q, want the chart %s and the helm install command", first.stdout, chartRef)
	}
	chartDigest := digestAt(t, r, chartRef)

	helmBin, err := pinnedHelm(context.Background(), repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) string {
		t.Helper()
		home := t.TempDir()
		cmd := exec.Command(helmBin, args...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+creds, "HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	oci := "oci://" + hub + "/charts/istio-cni"
	meta := helm("show", "chart", oci, "--version", "1.2.3", "--ca-file", r.CAFile)
	for _, want := range []string{"name: istio-cni", "version: 1.2.3", "appVersion: v1.2.3"} {
		if !strings.Contains(meta, want+"\n") {
			t.Errorf("helm show chart: no %q in\n%s", want, meta)
		}
	}
	rendered := helm("template", "istio-cni", oci, "--version", "1.2.3", "--ca-file", r.CAFile, "-n", "kube-system")
	if want := "image: \"" + hub + "/install-cni@" + digest.String() + "\""; !strings.Contains(rendered, want) {
		t.Errorf("the pushed chart does not render %s by default", want)
	}

	second := runPush(t, creds, args...)
	if second.err != nil {
		t.Fatalf("second push: %v\n%s", second.err, second.stderr)
	}
	if strings.Count(second.stdout, "(unchanged") != 2 {
		t.Errorf("second push printed %q, want the image and the chart unchanged", second.stdout)
	}
	if got := digestAt(t, r, chartRef); got != chartDigest {
		t.Errorf("the second push moved %s from %s to %s", chartRef, chartDigest, got)
	}
}
