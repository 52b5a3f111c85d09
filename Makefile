# goccl: make test (CPU tier, what CI runs), make smoke (arsmoke on this node's GPUs),
# make gpu-bundle (GPU test binaries + run script for a GPU machine without Go).
GO       ?= go
# go-nvml's cgo build warns about every deprecated NVML call it wraps.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
PKGS     := ./...
BUNDLE   := gpu-bundle
# Packages whose tests hold GPU tests; each becomes one binary in the bundle.
GPU_PKGS := driver collective internal/topology cmd/arsmoke

.PHONY: all build test tools vet smoke gpu-bundle clean

all: build

build:
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=1 $(GO) build $(PKGS)

# tools fetches libcuda1, libnvidia-ml1 and ptxas into .tools (see scripts/fetch-tools.sh).
tools:
	scripts/fetch-tools.sh >.tools.env

vet:
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)

test: tools build vet
	. ./.tools.env && CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 10m $(PKGS)
	. ./.tools.env && CGO_ENABLED=0 $(GO) test -count=1 -timeout 10m $(PKGS)

smoke:
	CGO_ENABLED=0 $(GO) run ./cmd/arsmoke

gpu-bundle:
	rm -rf $(BUNDLE) && mkdir -p $(BUNDLE)
	for p in $(GPU_PKGS); do \
	  [ -d $$p ] || continue; \
	  n=$$(echo $$p | tr / _); \
	  CGO_ENABLED=0 $(GO) test -c -ldflags=-s -o $(BUNDLE)/$$n.test ./$$p || exit 1; \
	  if [ -d $$p/testdata ]; then mkdir -p $(BUNDLE)/$$n.d && cp -r $$p/testdata $(BUNDLE)/$$n.d/; fi; \
	done
	# The cgo build of internal/topology (go-nvml), so that both NVML bindings run on the GPU.
	CGO_ENABLED=1 $(GO) test -c -ldflags=-s -o $(BUNDLE)/internal_topology_cgo.test ./internal/topology
	cp -r $(BUNDLE)/internal_topology.d $(BUNDLE)/internal_topology_cgo.d
	[ ! -d cmd/arsmoke ] || CGO_ENABLED=0 $(GO) build -o $(BUNDLE)/arsmoke ./cmd/arsmoke
	cp scripts/run-gpu-bundle.sh $(BUNDLE)/run.sh

clean:
	rm -rf $(BUNDLE) .tools .tools.env
