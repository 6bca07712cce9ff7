# The make targets are the project's interface: demo, test, bench, lint.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/bin
VERSION ?= dev

.PHONY: all build deps prereqs test test-node test-unit test-race bench bench-add demo demo-netns image push lint fuzz clean

all: build

# deps installs what a fresh Debian machine lacks (idempotent; needs root).
deps:
	@hack/install-deps.sh

# Binaries ship static (CGO_ENABLED=0: the plugin is exec'd per pod, and the dynamic
# loader alone costs it ~0.7 ms) and stripped.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $(BIN)/ ./cmd/...

# prereqs builds the cached Kubernetes binaries (KUBE_VERSION, default
# hack/kube/DEFAULT), containerd and runc, and the reference CNI plugins (first run
# only: about 15 minutes on 2 cores; later runs take seconds).
prereqs: deps
	@hack/kube-binaries.sh etcd kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy kubectl >/dev/null
	@hack/runtime-binaries.sh >/dev/null
	@hack/cni-plugins.sh >/dev/null
	@hack/tools/install.sh >/dev/null
	@hack/tools/install.sh syft >/dev/null
	@hack/tools/install.sh promtool >/dev/null
	@hack/registry-binary.sh >/dev/null

# test runs every test, including the real-kernel and real-control-plane ones (root),
# and fails if the run left the host changed (hack/test.sh, hack/hostcheck).
test:
	@hack/test.sh

# test-node runs the node end-to-end tests on one Kubernetes release and containerd:
#   sudo make test-node KUBE_VERSION=v1.35.4 [CONTAINERD_VERSION=v2.4.2]
test-node: prereqs
	KUBE_VERSION=$(KUBE_VERSION) CONTAINERD_VERSION=$(CONTAINERD_VERSION) $(GO) test -count=1 -timeout 30m ./test/node/ ./test/nodee2e/

# test-unit runs the packages whose tests need neither root, a kernel feature nor
# the cached Kubernetes binaries (they all pass as an unprivileged user), built with
# the tag unitonly, which leaves out their few test files that need root (those carry
# //go:build !unitonly; test/layout checks it); every other test fails loudly
# without root, and make test runs them all.
UNIT_PKGS := ./internal/redirect/ ./internal/plugin/ ./internal/cnicmd/ ./internal/cniconf/ ./internal/istioiptables/ \
	./internal/kube/ ./internal/cli/ ./internal/settings/ ./internal/pluginlog/ ./internal/ownfile/ ./internal/regularfile/ ./internal/apibound/ ./internal/unixsock/ \
	./hack/hostcheck/ ./test/harness/trace/
test-unit:
	$(GO) test -count=1 -tags unitonly $(UNIT_PKGS)

# test-race runs the product packages' tests under the race detector, with the
# binaries they build (install-cni, istio-cni, istio-iptables) race-built too (they
# inherit GOFLAGS); an agent under test that prints a data race fails its test.
# Needs root and cgo (a C compiler); about 13 min once the race builds are cached.
test-race: prereqs
	CGO_ENABLED=1 GOFLAGS=-race $(GO) test -count=1 -p 1 -timeout 60m ./internal/... ./cmd/...

# bench prints the figures (latencies p50/p99, sizes, memory); it asserts no figure,
# but a benchmark that fails makes it exit non-zero (after the others have run).
# The plugin's ADD (test/e2e BenchmarkPluginAdd) is printed per backend with its
# phases, against the goals and side by side with Istio's own plugin (the ratio, see
# the README's "ADD latency"): the one hack/tools/istio-cni-peer pins, built on first
# use (hack/peer.sh), or ISTIO_CNI_PLUGIN=<Istio's istio-cni binary>, or none with
# ISTIO_CNI_PLUGIN=none. bench-add runs only that.
BENCHTIME ?= 50x
ISTIO_CNI_PLUGIN ?=
export ISTIO_CNI_PLUGIN
# The repair benchmarks size themselves (20 samples, 5,000 pods): they run once. So
# does the cluster simulation (test/scale: SCALE_PODS, SCALE_AGENTS, SCALE_WINDOW,
# SCALE_CHURN; about 30 minutes with the defaults).
bench: prereqs
	set -o pipefail; rc=0; peer=$$(hack/peer.sh) || exit 1; \
	ISTIO_CNI_PLUGIN="$$peer" $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 -timeout 60m $$($(GO) list ./... | grep -v '/internal/repair$$\|/test/scale$$') 2>&1 | tee bench.out || rc=1; \
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m ./internal/repair/ 2>&1 | tee -a bench.out || rc=1; \
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 90m ./test/scale/ 2>&1 | tee -a bench.out || rc=1; \
	[[ $$rc == 0 ]] || echo 'make bench: a benchmark failed (FAIL in bench.out); the figures of the others are printed above' >&2; exit $$rc

bench-add: prereqs
	set -o pipefail; peer=$$(hack/peer.sh) || exit 1; \
	ISTIO_CNI_PLUGIN="$$peer" $(GO) test -run '^$$' -bench 'BenchmarkPluginAdd$$' -benchtime $(BENCHTIME) -count 1 -timeout 30m ./test/e2e/ 2>&1 | tee bench-add.out

# demo brings up a real node (kubelet + containerd), helm-installs istio-cni from an
# image built here, runs meshed pods with an istio-proxy stand-in and shows their
# traffic going through it; non-zero exit if anything does not hold. KEEP=1 keeps
# the node, the chart and the pods up until Ctrl-C, then uninstalls and takes it down.
demo: deps
	$(GO) run ./hack/demo

# image builds the install-cni image index (linux/amd64 and linux/arm64, its SPDX
# SBOM beside it) and the demo's image as reproducible OCI archives in bin/images,
# without a Docker engine, and prints their digests. VERSION (default dev) is
# stamped into the binaries and the image's org.opencontainers.image.version label.
image:
	$(GO) run ./hack/demo -images $(BIN)/images -version '$(VERSION)'

# push builds the image of version TAG (make image VERSION=TAG) and puts it and the Helm chart, packaged to
# default to that image, into an OCI registry (hack/push):
#   make push HUB=registry.example.com/mesh TAG=1.0.0 [CA_FILE=ca.pem] [CHART_REPO=...] [CHART_VERSION=...]
# image: HUB/install-cni:TAG; chart: oci://CHART_REPO/istio-cni, version CHART_VERSION
# (defaults: HUB/charts, TAG without a leading v). Credentials come from the docker
# config (docker login) and its credential helpers.
push:
	@[[ -n "$(HUB)" && -n "$(TAG)" ]] || { echo 'make push: set HUB and TAG, for example: make push HUB=registry.example.com/mesh TAG=1.0.0' >&2; exit 1; }
	@$(MAKE) --no-print-directory image VERSION='$(TAG)'
	$(GO) run ./hack/push -hub '$(HUB)' -tag '$(TAG)' -images $(BIN)/images -ca-file '$(CA_FILE)' -chart-repo '$(CHART_REPO)' -chart-version '$(CHART_VERSION)'

# demo-netns applies the capture to a throwaway network namespace and shows live traffic.
demo-netns: deps
	$(GO) run ./hack/capture-demo

# fuzz runs every fuzzer in the repository for FUZZTIME each.
FUZZTIME ?= 20s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list 'Fuzz.*' $$pkg 2>/dev/null | grep ^Fuzz); do \
			echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; done

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

clean:
	rm -rf $(BIN) bench.out bench-add.out
