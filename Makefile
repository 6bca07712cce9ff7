# The make targets are the project's interface: demo, test, bench, lint.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/bin

.PHONY: all build deps test test-unit bench demo lint fuzz clean

all: build

# deps installs what a fresh Debian machine lacks (idempotent; needs root).
deps:
	@hack/install-deps.sh

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# test runs every test, including the real-kernel ones (root, network namespaces).
test: deps
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 20m ./...

# test-unit runs only the tests that need neither root nor a kernel.
test-unit:
	$(GO) test -count=1 -run 'Conform|Parse|Plan|Trace|Options|Render|Golden|Invariant' ./internal/...

# bench prints the figures (apply latency per backend, p50/p99); it asserts nothing.
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 200x -count 1 ./internal/capture/ ./internal/nftables/ 2>&1 | tee bench.out

# demo applies the capture to a throwaway network namespace and shows live traffic.
demo: deps build
	$(BIN)/capture-demo

fuzz:
	@for f in $$($(GO) test -list 'Fuzz.*' ./internal/redirect/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 20s ./internal/redirect/ || exit 1; done

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

clean:
	rm -rf $(BIN) bench.out
