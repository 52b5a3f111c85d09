# goccl: make test (CPU tier, what CI runs), make smoke (arsmoke on this node's GPUs),
# make gpu-bundle (GPU test binaries + run script for a GPU machine without Go).
GO       ?= go
PKGS     := ./...
BUNDLE   := gpu-bundle
# Packages whose tests hold GPU tests; each becomes one binary in the bundle.
GPU_PKGS := driver nccl collective internal/topology cmd/arsmoke

# Every default build is cgo-free in what goccl links: NVML is bound through purego whatever
# CGO_ENABLED says. The goccl_nvml_cgo tag swaps in NVIDIA's go-nvml (cgo); its C headers warn
# about every deprecated NVML call they declare, hence the flag, set only where the tag is.
NVML_CGO_TAG    := goccl_nvml_cgo
NVML_CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
NVML_CGO        := CGO_ENABLED=1 CGO_CFLAGS="$(NVML_CGO_CFLAGS)"

.PHONY: all build test check-tree tools vet smoke gpu-bundle clean

all: build

build:
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=1 $(GO) build $(PKGS)
	$(NVML_CGO) $(GO) build -tags $(NVML_CGO_TAG) $(PKGS)

# check-tree fails on tracked binaries, files over 1 MiB and tracked files .gitignore ignores.
check-tree:
	scripts/check-tree.sh

# tools fetches libcuda1, libnvidia-ml1 and ptxas into .tools (see scripts/fetch-tools.sh).
tools:
	scripts/fetch-tools.sh >.tools.env

vet:
	CGO_ENABLED=1 $(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	$(NVML_CGO) $(GO) vet -tags $(NVML_CGO_TAG) ./internal/topology

# test checks the tree first, then builds and vets everything, then runs the default tests
# with and without cgo (the race detector needs cgo), then internal/topology's go-nvml build
# (its mock-server tests exist only under the tag).
test: check-tree
	$(MAKE) --no-print-directory tools build vet
	. ./.tools.env && CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 10m $(PKGS)
	. ./.tools.env && CGO_ENABLED=0 $(GO) test -count=1 -timeout 10m $(PKGS)
	. ./.tools.env && $(NVML_CGO) $(GO) test -tags $(NVML_CGO_TAG) -race -count=1 -timeout 10m ./internal/topology

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
	# internal/topology once more with go-nvml, so that both NVML bindings run on the GPU.
	$(NVML_CGO) $(GO) test -c -ldflags=-s -tags $(NVML_CGO_TAG) -o $(BUNDLE)/internal_topology_cgo.test ./internal/topology
	cp -r $(BUNDLE)/internal_topology.d $(BUNDLE)/internal_topology_cgo.d
	[ ! -d cmd/arsmoke ] || CGO_ENABLED=0 $(GO) build -o $(BUNDLE)/arsmoke ./cmd/arsmoke
	cp scripts/run-gpu-bundle.sh $(BUNDLE)/run.sh

clean:
	rm -rf $(BUNDLE) .tools .tools.env
