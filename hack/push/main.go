// Command push puts the install-cni image that `make image` built, and the Helm chart
// packaged for it, into an OCI registry; it is what `make push` runs:
//
//	make push HUB=registry.example.com/mesh TAG=1.0.0 [CA_FILE=ca.pem] [CHART_REPO=...] [CHART_VERSION=...]
//
// The image (a single image or a multi-arch index, whichever the OCI archive
// holds) goes to HUB/install-cni:TAG. The chart is packaged by `helm package` with
// version CHART_VERSION (TAG without a leading v by default) and appVersion TAG,
// its values defaulting to that image (hub, tag and the pushed digest), and goes to
// CHART_REPO/istio-cni:CHART_VERSION (CHART_REPO defaults to HUB/charts), where
// `helm install istio-cni oci://CHART_REPO/istio-cni --version CHART_VERSION` finds it.
//
// Credentials come from the docker config and its credential helpers, TLS trusts
// the system's roots plus CA_FILE. A tag that already names the same digest is left
// alone, so pushing the same build twice changes nothing. See registry.go for the
// time bounds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// agentImage is the image's name under the hub (the chart's `image` value).
const agentImage = "install-cni"

type config struct {
	hub, tag             string
	images, archive      string
	caFile               string
	chartDir             string
	chartRepo, chartVers string
	helm                 string
	timeout              time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.hub, "hub", "", "registry and path to push the image under: <hub>/install-cni:<tag> (make push HUB=...)")
	flag.StringVar(&cfg.tag, "tag", "", "the image's tag (make push TAG=...)")
	flag.StringVar(&cfg.images, "images", "bin/images", "directory where make image wrote the OCI archives; the one naming an install-cni image is pushed")
	flag.StringVar(&cfg.archive, "archive", "", "push this OCI archive or layout directory instead of looking in -images")
	flag.StringVar(&cfg.caFile, "ca-file", "", "PEM file of CAs to trust besides the system's (make push CA_FILE=...)")
	flag.StringVar(&cfg.chartDir, "chart", "charts/istio-cni", "the chart to package and push; empty: push the image only")
	flag.StringVar(&cfg.chartRepo, "chart-repo", "", "where the chart goes: <chart-repo>/istio-cni:<chart-version>; empty: <hub>/charts (make push CHART_REPO=...)")
	flag.StringVar(&cfg.chartVers, "chart-version", "", "the chart's version; empty: the tag without a leading v, which must then be SemVer (make push CHART_VERSION=...)")
	flag.StringVar(&cfg.helm, "helm", "", "helm binary for helm package; empty: the pinned one (hack/tools/install.sh)")
	flag.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "bound of the whole push")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "push:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.hub == "" || cfg.tag == "" {
		return errors.New("HUB and TAG must be set: make push HUB=registry.example.com/mesh TAG=1.0.0")
	}
	imageRef, err := name.NewTag(cfg.hub+"/"+agentImage+":"+cfg.tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("HUB=%q TAG=%q do not make an image name: %w", cfg.hub, cfg.tag, err)
	}
	var chartVersion string
	if cfg.chartDir != "" {
		if chartVersion, err = chartVersionFor(cfg.tag, cfg.chartVers); err != nil {
			return err
		}
		if cfg.chartRepo == "" {
			cfg.chartRepo = cfg.hub + "/charts"
		}
		if _, err := name.NewRepository(cfg.chartRepo, name.StrictValidation); err != nil {
			return fmt.Errorf("CHART_REPO=%q: %w", cfg.chartRepo, err)
		}
	}
	client, err := newRegistryClient(cfg.caFile)
	if err != nil {
		return err
	}
	client.timeout = cfg.timeout
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	work, err := os.MkdirTemp("", "istio-cni-push-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	archive := cfg.archive
	if archive == "" {
		if archive, err = findArchive(cfg.images, agentImage); err != nil {
			return err
		}
	}
	art, err := loadArtifact(archive, work)
	if err != nil {
		return err
	}
	img, err := client.push(ctx, imageRef, art)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "image %s: %s, from %s\n", img, art.kind(), archive)
	if cfg.chartDir == "" {
		return nil
	}

	helm := cfg.helm
	if helm == "" {
		if helm, err = pinnedHelm(ctx, "."); err != nil {
			return err
		}
	}
	tgz, err := packageChart(ctx, helm, cfg.chartDir, work, chartVersion, chartDefaults{Hub: cfg.hub, Tag: cfg.tag, Digest: img.digest.String()})
	if err != nil {
		return err
	}
	chart, chartName, _, err := chartArtifact(tgz)
	if err != nil {
		return err
	}
	chartRef, err := name.NewTag(cfg.chartRepo+"/"+chartName+":"+chartVersion, name.StrictValidation)
	if err != nil {
		return err
	}
	ch, err := client.push(ctx, chartRef, chart)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "chart %s: version %s, appVersion %s, defaults to the image %s/%s:%s@%s\n", ch, chartVersion, cfg.tag, cfg.hub, agentImage, cfg.tag, img.digest)
	caFlag := ""
	if cfg.caFile != "" {
		caFlag = " --ca-file " + cfg.caFile
	}
	fmt.Fprintf(out, "install it with:\n  helm install istio-cni oci://%s/%s --version %s%s -n kube-system [-f charts/istio-cni/profiles/<platform>.yaml] [--set 'imagePullSecrets={SECRET}']\n",
		cfg.chartRepo, chartName, chartVersion, caFlag)
	return nil
}

// pinnedHelm is the helm that hack/tools/install.sh of the repository at root
// builds (first run only) and names on its last line of output.
func pinnedHelm(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "tools", "install.sh"))
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools/install.sh (run make push from the repository's root, or pass -helm): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return filepath.Join(lines[len(lines)-1], "helm"), nil
}
